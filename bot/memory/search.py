"""Full-history search for the agent (`search_history`) and the CLI (`steward search`).

The agent only ever searches the asking conversation's scope: what a person said in a DM
(scope "private:<person>") never reaches anyone else, and a shared channel
("channel:<id>") sees only what was said in it. The CLI is the owner's view of the whole
store, optionally narrowed to one session. Ranking and query syntax: `store/search.py`
(any word of a question counts, none is required).

The tool only reads the store: `safe`.
"""

import asyncio
import json
import logging
import time
from dataclasses import replace
from datetime import UTC, datetime, tzinfo
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from bot.memory import embeddings as _embeddings
from bot.memory.when import parse_when
from bot.runtime import Policy
from bot.tools import ToolContext, tool
from bot.tools.permissions import PRIVATE, READS_OUTSIDE
from store import Conversation, Entry, Hit, NotFound, Store, open_store
from store.hybrid import find
from store.search import parse_query, query_terms

__all__ = ["MAX_LIMIT", "excerpt", "hit_json", "remember", "render_hits", "search_command",
           "search_history"]

log = logging.getLogger(__name__)

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


def excerpt(text: str, query: str, width: int) -> str:
    """`width` characters of `text` on one line, around the first place a word the search
    looked up occurs (else from the start), with … where something was cut."""
    flat = _one_line(text)
    if len(flat) <= width:
        return flat
    low = flat.casefold()
    found = [i for term in query_terms(parse_query(query))
             for word in [term.text, *term.text.split()]
             if (i := low.find(word.casefold())) >= 0]
    start = max(0, min(found, default=0) - width // 4)
    start = min(start, len(flat) - width)
    cut = flat[start:start + width]
    return ("…" if start > 0 else "") + cut + ("…" if start + width < len(flat) else "")


async def remember(store: Store, query: str, *, scopes: list[str] | None = None,
                   conversation_key: str | None = None, limit: int = 10, offset: int = 0,
                   context: int = 1, zone: tzinfo = UTC, at: float | None = None,
                   embedder: "_embeddings.Embedder | None" = None) -> list[Hit]:
    """The one retrieval behind `search_history`, `steward search` and the automatic
    recall: a time phrase of the question ("last spring", "yesterday", "in May 2023", read
    in `zone` as of `at`, default now) weighs what was said then (a relative phrase is no
    word to look up: "yesterday" is taken out); a name in it weighs what that person said;
    with an `embedder` whose hybrid ranking is on, the question's embedding is fused with
    the words (store/hybrid.py). An embedding provider that fails leaves the words alone."""
    clock = at if at is not None else time.time()
    when = parse_when(query, now=clock, zone=zone)
    words = when.rest(query) if when else query
    window = (when.since, when.until) if when else None
    embedding = None
    if embedder is not None and embedder.hybrid and words.strip():
        try:
            embedding = (await embedder.embed([words]))[0]
        except _embeddings.EmbeddingError as exc:
            log.warning("search without embeddings: %s", exc)
    return await find(store, words, scopes=scopes, conversation_key=conversation_key,
                      limit=limit, offset=offset, context=context,
                      at=None if at is None else -(-at // 3600) * 3600, when=window,
                      embedding=embedding, model=embedder.model if embedder else "",
                      fusion=embedder.fusion if embedder else _embeddings.DEFAULT_FUSION)


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
        when = datetime.fromtimestamp(h.entry.created_at, zone).strftime(
            "%a %Y-%m-%d %H:%M %Z")
        lines.append(f"{n}. {when} · {h.conversation_key} · #{h.entry.seq}")
        for e in h.before:
            lines.append(f"   … {_speaker(e)}: {excerpt(e.text, query, NEIGHBOUR_CHARS)}")
        lines.append(f"   > {_speaker(h.entry)}: {excerpt(h.entry.text, query, HIT_CHARS)}")
        for e in h.after:
            lines.append(f"   … {_speaker(e)}: {excerpt(e.text, query, NEIGHBOUR_CHARS)}")
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


# Hits are old text, much of it from outside (mail, pages quoted): data, never permission.
@tool(policy=Policy.SAFE, touches=frozenset({PRIVATE, READS_OUTSIDE}))
async def search_history(
    ctx: ToolContext,
    query: Annotated[str, Field(
        min_length=1, max_length=500,
        description='a question or words: every word counts, none is required; '
                    '"quoted words" must occur as written; word* for words starting so')],
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description="results per page")] = 5,
    page: Annotated[int, Field(ge=1, description="1 for the best matches, then 2, 3…")] = 1,
) -> str:
    """Search everything said before that you may see here — earlier messages, older
    conversations, compacted history. Ask in plain words ("when did Anna go climbing?"):
    rare words and the speaker's name weigh most, word forms are matched ("climbed",
    "climbing"), "exact phrases" are required. Best and most recent matches first, each
    with its date, conversation and neighbouring messages."""
    if ctx.conversation_id is None:
        return "error: search_history needs a conversation"
    conversation = await ctx.store.get_conversation_by_id(ctx.conversation_id)
    zone = await _zone(ctx.timezone)
    asking = await _asking_turn(ctx)
    hits = await remember(ctx.store, query, scopes=await visible_scopes(ctx.store, conversation),
                          limit=limit + 1, offset=(page - 1) * limit, zone=zone,
                          embedder=_embeddings.attached(ctx.store))
    hits = [_without(h, asking) for h in hits if not _asked(h.entry, asking)][:limit]
    return render_hits(hits, query, page=page, limit=limit, zone=zone)


TURN = "turn"  # bot.agent.inbox.TURN (memory sits below the agent and cannot import it)


async def _asking_turn(ctx: ToolContext) -> str | None:
    """The turn this call works for (through an approval, if it waited for one): the
    message that turn answers is in the model's context, and no hit of its own search."""
    task_id: str | None = ctx.task_id
    for _ in range(3):  # tool call -> (approval ->) turn
        try:
            task = await ctx.store.get_task(task_id)
        except NotFound:
            return None
        if task.kind == TURN:
            return task.id
        task_id = task.parent_id
        if task_id is None:
            return None
    return None


def _asked(e: Entry, turn: str | None) -> bool:
    return turn is not None and e.kind == "user" and e.task_id == turn


def _without(h: Hit, turn: str | None) -> Hit:
    if turn is None:
        return h
    return replace(h, before=tuple(e for e in h.before if not _asked(e, turn)),
                   after=tuple(e for e in h.after if not _asked(e, turn)))


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


def _readable(h: Hit, query: str, zone: tzinfo = UTC) -> str:
    e = h.entry
    ts = datetime.fromtimestamp(e.created_at, zone).strftime("%a %Y-%m-%d %H:%M:%S %Z")
    lines = [f"{h.conversation_key} #{e.seq}  {ts}  {_speaker(e)}  score {h.score:.4g}"]
    lines += [f"    [{b.seq}] {_speaker(b)}: {excerpt(b.text, query, 200)}"
              for b in h.before]
    lines.append(f"  > [{e.seq}] {_speaker(e)}: {excerpt(e.text, query, 600)}")
    lines += [f"    [{a.seq}] {_speaker(a)}: {excerpt(a.text, query, 200)}" for a in h.after]
    return "\n".join(lines)


async def search_command(config, args) -> int:
    """`steward search QUERY [--session KEY] [--limit K] [--json]`: the owner's search over
    every conversation (or one session), best first."""
    query = " ".join(args.query) if isinstance(args.query, list | tuple) else args.query
    limit = args.limit if getattr(args, "limit", None) else 10
    zone = await _zone(config.agent.timezone)
    store = await open_store(config.store_url)
    try:
        async with _embeddings.from_config(config) as embedder:
            hits = await remember(store, query, conversation_key=getattr(args, "session", None),
                                  limit=limit, zone=zone, embedder=embedder)
    finally:
        await store.close()
    if getattr(args, "json", False):
        for h in hits:
            print(json.dumps(hit_json(h), ensure_ascii=False))
        return 0
    print("\n\n".join(_readable(h, query, zone) for h in hits) if hits else "no matches")
    return 0
