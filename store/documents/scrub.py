"""A document that stays after a forget (store/forget), rewritten without what the
forgotten conversations and tasks wrote into it.

The documents the agent keeps for several people (a shared channel's facts, a shared
thread's to-do list) are lists of items that each keep an `id` for good (bot/tools/items.py).
An edit made by what is forgotten (a version whose conversation or task goes) added or
changed items: those items go from the newest value, whoever edited them since, and so do
they from every copy a fork took of the document (`inherited`: a copy keeps the ids).
Every older version goes too (they hold the items as they were): the document is left
with its version 0 (the initial value) and one new version, a snapshot of what remains,
numbered after the newest, so an edit made against the newest version meanwhile is
refused and made again (`DocumentConflict`). A read as of a position before that snapshot
finds the initial value: the document's past is not kept.

A value that is not such a list cannot be taken apart: it is kept as it is now, its history
dropped all the same.
"""

import json
from dataclasses import dataclass, field
from typing import Any

from store.documents.ops import OpError, apply_ops
from store.read.plain import run
from store.records import dumps, now

ITEMS = "items"


@dataclass
class Scrub:
    """What a document loses: the keys of its items that go, with their texts."""

    keys: set = field(default_factory=set)
    texts: set[str] = field(default_factory=set)


def _items(value: Any) -> dict | None:
    """The items of a list document by id (an item without an id by its JSON), or None."""
    if not isinstance(value, dict) or not isinstance(value.get(ITEMS), list):
        return None
    out = {}
    for item in value[ITEMS]:
        ident = item.get("id") if isinstance(item, dict) else None
        key = ident if isinstance(ident, int) and not isinstance(ident, bool) else \
            ("json", json.dumps(item, sort_keys=True, ensure_ascii=False))
        out[key] = item
    return out


def _changed(before: Any, after: Any) -> dict:
    """The items `after` added or changed since `before`, by key."""
    old, new = _items(before) or {}, _items(after) or {}
    return {k: item for k, item in new.items() if k not in old or old[k] != item}


def _loaded(raw: str | None) -> Any:
    try:
        return json.loads(raw) if raw is not None else None
    except ValueError:
        return None


def _text(item: Any) -> str | None:
    value = item.get("text") if isinstance(item, dict) else item
    return value if isinstance(value, str) else None


def _replay(rows: list, gone_conversations: set[int], gone_tasks: set[str],
            inherited: Scrub) -> tuple[Any, Scrub]:
    """The newest value, given the versions' rows in order (version, base, ops,
    conversation_id, task_id), and what goes from it."""
    value: Any = None
    taken = Scrub(set(inherited.keys), set(inherited.texts))
    for row in rows:
        previous = value
        if row.base is not None:
            value = _loaded(row.base)
        else:
            try:
                value = apply_ops(value, _loaded(row.ops) or [])
            except OpError:
                continue  # a broken history: what is newest is kept as it reads
        if row.version > 0 and (row.conversation_id in gone_conversations
                                or row.task_id in gone_tasks):
            for key, item in _changed(previous, value).items():
                taken.keys.add(key)
                if (said := _text(item)) is not None:
                    taken.texts.add(said)
    for key, item in (_items(value) or {}).items():  # their text, as it reads now
        if key in taken.keys and (said := _text(item)) is not None:
            taken.texts.add(said)
    return value, taken


async def _rows(conn, doc_id: int) -> list:
    return (await run(conn, (
        "SELECT version, base, ops, conversation_id, task_id, at_seq FROM document_versions "
        "WHERE document_id = :d ORDER BY version"), {"d": doc_id})).all()


async def taken(conn, doc_id: int, gone_conversations: set[int], gone_tasks: set[str],
                inherited: Scrub) -> Scrub:
    """What the document `doc_id` loses (nothing is written)."""
    return _replay(await _rows(conn, doc_id), gone_conversations, gone_tasks, inherited)[1]


async def rewrite(conn, doc_id: int, gone_conversations: set[int], gone_tasks: set[str],
                  inherited: Scrub) -> Scrub:
    """Rewrite the document `doc_id` (locked by the caller) as the module says; returns
    what it lost."""
    rows = await _rows(conn, doc_id)
    if not rows:
        return Scrub()
    value, lost = _replay(rows, gone_conversations, gone_tasks, inherited)
    items = _items(value)
    if lost.keys and items is not None:
        value = {**value, ITEMS: [item for key, item in items.items() if key not in lost.keys]}
    newest = rows[-1]
    await run(conn, "DELETE FROM document_versions WHERE document_id = :d AND version > 0",
              {"d": doc_id})
    await run(conn, (
        "UPDATE document_versions SET conversation_id = NULL, task_id = NULL "
        "WHERE document_id = :d AND version = 0"), {"d": doc_id})
    t = now()
    version = newest.version + 1
    await run(conn, (
        "INSERT INTO document_versions (document_id, version, base, ops, conversation_id, "
        "at_seq, task_id, created_at) VALUES (:d, :v, :base, NULL, NULL, :at, NULL, :t)"),
        {"d": doc_id, "v": version, "base": dumps(value), "at": newest.at_seq, "t": t})
    await run(conn, "UPDATE documents SET version = :v, updated_at = :t WHERE id = :d",
              {"v": version, "t": t, "d": doc_id})
    return lost
