"""Full-history search for the agent (`search_history`) and the CLI (`steward search`).

The agent only ever searches the asking conversation's scope: what a person said in a DM
(scope "private:<person>") never reaches anyone else, and a shared channel
("channel:<id>") sees only what was said in it. The CLI is the owner's view of the whole
store, optionally narrowed to one session. Ranking and query syntax: `store/search.py`.

The tool only reads the store: `safe`.
"""

import asyncio
import json
from datetime import UTC, datetime, tzinfo
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from bot.runtime import Policy
from bot.tools import ToolContext, tool
from store import Conversation, Entry, Hit, Store, open_store
from store.search import parse_query

__all__ = ["MAX_LIMIT", "hit_json", "render_hits", "search_command", "search_history"]

MAX_LIMIT = 20
HIT_CHARS = 400  # of a hit's text shown to the model, around the first match
NEIGHBOUR_CHARS = 160
# The DESIGN.md contract: role is user, assistant or tool (a compaction summary was written
# by the model; `kind` keeps the exact entry kind).
ROLES = {"user": "user", "assistant": "assistant", "tool_result": "tool",
         "compaction": "assistant"}
_LABELS = {"user": "user", "assistant": "assistant", "tool_result": "tool",
           "compaction": "summary"}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _excerpt(text: str, query: str, width: int) -> str:
    """`width` characters of `text` on one line, around the first place a query term
    occurs (else from the start), with … where something was cut."""
    flat = _one_line(text)
    if len(flat) <= width:
        return flat
    low = flat.casefold()
    found = [i for term in parse_query(query) for word in [term.text, *term.text.split()]
             if (i := low.find(word.casefold())) >= 0]
    start = max(0, min(found, default=0) - width // 4)
    start = min(start, len(flat) - width)
    cut = flat[start:start + width]
    return ("…" if start > 0 else "") + cut + ("…" if start + width < len(flat) else "")


def _speaker(e: Entry) -> str:
    label = _LABELS.get(e.kind, e.kind)
    if e.kind == "tool_result" and isinstance(e.data, dict) and e.data.get("name"):
        label = f"tool {e.data['name']}"
    return f"{label} ({e.author})" if e.author else label


async def _zone(name: str) -> tzinfo:
    try:
        return await asyncio.to_thread(ZoneInfo, name)  # reads a file: off the loop
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return UTC


def render_hits(hits: list[Hit], query: str, *, page: int, limit: int, zone: tzinfo) -> str:
    """Hits as compact text for the model: when, where, who, the match and its
    neighbours, each cut to a few hundred characters."""
    if not hits:
        return (f"No matches for {query!r}." if page == 1
                else f"No more matches for {query!r} (page {page}).")
    first = (page - 1) * limit + 1
    lines = [f"Results {first}-{first + len(hits) - 1} for {query!r}, best first:"]
    for n, h in enumerate(hits, first):
        when = datetime.fromtimestamp(h.entry.created_at, zone).strftime("%Y-%m-%d %H:%M %Z")
        lines.append(f"{n}. {when} · {h.conversation_key} · #{h.entry.seq}")
        for e in h.before:
            lines.append(f"   … {_speaker(e)}: {_excerpt(e.text, query, NEIGHBOUR_CHARS)}")
        lines.append(f"   > {_speaker(h.entry)}: {_excerpt(h.entry.text, query, HIT_CHARS)}")
        for e in h.after:
            lines.append(f"   … {_speaker(e)}: {_excerpt(e.text, query, NEIGHBOUR_CHARS)}")
    if len(hits) == limit:
        lines.append(f"(More may match: page={page + 1}.)")
    return "\n".join(lines)


async def visible_scopes(store: Store, conversation: Conversation) -> list[str]:
    """What a search from this conversation may see: its own scope; from a person's private
    conversation, also the channels where that person talked with Steward (never the
    other way round: a channel's search does not reach anyone's private scope)."""
    scopes = [conversation.scope]
    if conversation.scope.startswith("private:") and conversation.owner:
        scopes += await store.shared_scopes_of(conversation.owner)
    return scopes


@tool(policy=Policy.SAFE)
async def search_history(
    ctx: ToolContext,
    query: Annotated[str, Field(
        min_length=1, max_length=500,
        description='words that must all occur; "quoted words" for an exact phrase')],
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description="results per page")] = 5,
    page: Annotated[int, Field(ge=1, description="1 for the best matches, then 2, 3…")] = 1,
) -> str:
    """Search everything said before that you may see here — earlier messages, older
    conversations, compacted history — for words or "exact phrases". Best and most recent
    matches first, each with its date, conversation and neighbouring messages."""
    if ctx.conversation_id is None:
        return "error: search_history needs a conversation"
    conversation = await ctx.store.get_conversation_by_id(ctx.conversation_id)
    hits = await ctx.store.search(query, scopes=await visible_scopes(ctx.store, conversation),
                                  limit=limit, offset=(page - 1) * limit)
    return render_hits(hits, query, page=page, limit=limit, zone=await _zone(ctx.timezone))


# -- the CLI ------------------------------------------------------------------------------


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _context_json(e: Entry) -> dict:
    return {"entry": e.seq, "role": ROLES.get(e.kind, e.kind), "author": e.author,
            "text": e.text, "ts": _ts(e.created_at)}


def hit_json(h: Hit) -> dict:
    """One result as `steward search --json` prints it (DESIGN.md contract)."""
    e = h.entry
    return {"session": h.conversation_key, "entry": e.seq, "role": ROLES.get(e.kind, e.kind),
            "kind": e.kind, "author": e.author, "text": e.text, "ts": _ts(e.created_at),
            "ref": e.ref, "score": round(h.score, 6),
            "before": [_context_json(b) for b in h.before],
            "after": [_context_json(a) for a in h.after]}


def _readable(h: Hit, query: str) -> str:
    e = h.entry
    ts = datetime.fromtimestamp(e.created_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    lines = [f"{h.conversation_key} #{e.seq}  {ts}  {_speaker(e)}  score {h.score:.4g}"]
    lines += [f"    [{b.seq}] {_speaker(b)}: {_excerpt(b.text, query, 200)}"
              for b in h.before]
    lines.append(f"  > [{e.seq}] {_speaker(e)}: {_excerpt(e.text, query, 600)}")
    lines += [f"    [{a.seq}] {_speaker(a)}: {_excerpt(a.text, query, 200)}" for a in h.after]
    return "\n".join(lines)


async def search_command(config, args) -> int:
    """`steward search QUERY [--session KEY] [--limit K] [--json]`: the owner's search over
    every conversation (or one session), best first."""
    query = " ".join(args.query) if isinstance(args.query, list | tuple) else args.query
    limit = args.limit if getattr(args, "limit", None) else 10
    store = await open_store(config.store_url)
    try:
        hits = await store.search(query, conversation_key=getattr(args, "session", None),
                                  limit=limit)
    finally:
        await store.close()
    if getattr(args, "json", False):
        for h in hits:
            print(json.dumps(hit_json(h), ensure_ascii=False))
        return 0
    print("\n\n".join(_readable(h, query) for h in hits) if hits else "no matches")
    return 0
