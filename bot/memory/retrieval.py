"""Retrieval over the whole history: the one `remember` behind the search tool, the
automatic recall and `steward search`, and that command itself.

Light on purpose: `steward search` imports this without the agent, the tools or
SQLAlchemy (on an SQLite store at this build's schema it reads through the standard
library: store/reader.py). Ranking and query syntax: `store/search.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.memory import embeddings as _embeddings
from bot.memory.when import parse_when
from store.hybrid import find
from store.read.reader import open_for_reading
from store.search import parse_query, query_terms

if TYPE_CHECKING:
    from store import Entry, Hit, Store

log = logging.getLogger(__name__)

# A question about what Steward itself said or did ("what did you suggest?", "your answer
# about the flights"): its own answers are ranked too (store/search.py `evidence`).
_TO_STEWARD = re.compile(r"\b(you|your|yours|steward)\b", re.IGNORECASE)


def about_answers(query: str) -> bool:
    """Whether a question asks about Steward's own answers."""
    return _TO_STEWARD.search(query) is not None

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
                   embedder: _embeddings.Embedder | None = None,
                   answers: bool | None = None) -> list[Hit]:
    """The one retrieval behind `search_history`, `steward search` and the automatic
    recall: a time phrase of the question ("last spring", "yesterday", "in May 2023", read
    in `zone` as of `at`, default now) weighs what was said then (a relative phrase is no
    word to look up: "yesterday" is taken out); a name in it weighs what that person said;
    with an `embedder` whose hybrid ranking is on, the question's embedding is fused with
    the words (store/hybrid.py). An embedding provider that fails leaves the words alone.

    Ranked is what people said; Steward's own answers only with `answers` (default: when
    the question speaks to Steward, `about_answers`). Searching one conversation without
    `at`, its time phrases are read as of its newest entry ("the week before" an imported
    chat from 2023 is a week of 2023, not of today's calendar)."""
    if at is None and conversation_key is not None:
        at = await _last_said(store, conversation_key)
    clock = at if at is not None else time.time()
    when = parse_when(query, now=clock, zone=zone)
    words = when.rest(query) if when else query
    window = (when.since, when.until) if when else None
    embedding = None
    if embedder is not None and embedder.hybrid and words.strip():
        try:
            embedding = (await embedder.embed_query([words]))[0]
        except _embeddings.EmbeddingError as exc:
            log.warning("search without embeddings: %s", exc)
    return await find(store, words, scopes=scopes, conversation_key=conversation_key,
                      limit=limit, offset=offset, context=context,
                      at=None if at is None else -(-at // 3600) * 3600, when=window,
                      embedding=embedding, model=embedder.model if embedder else "",
                      fusion=embedder.fusion if embedder else _embeddings.DEFAULT_FUSION,
                      answers=about_answers(query) if answers is None else answers)


async def _last_said(store: Store, key: str) -> float | None:
    """When the conversation's newest entry was written, if that is in the past."""
    from store import NotFound

    try:
        conversation = await store.get_conversation(key)
        newest = await store.entries_page(conversation.id, limit=1)
    except NotFound:
        return None
    if not newest or newest[-1].created_at >= time.time():
        return None
    return newest[-1].created_at


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
    store = await open_for_reading(config.store_url,  # snapshots as bot/app/opened.py
                                   snapshot_dir=config.home / "snapshots")
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
