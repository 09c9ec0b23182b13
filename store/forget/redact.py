"""The exact texts of forgotten items, cut out of what stays and quotes them.

A document that stays loses the items the forgotten wrote (store/documents/scrub.py), but
their texts were shown on the way: a tool's result in someone else's turn lists the whole
list ("Facts now: 1. ... 2. ..."), an answer may repeat it, a pinned request holds it. Each
such text (of `MIN_CHARS` or more, so that no common word is taken for one) becomes `CUT`
wherever it occurs verbatim in an entry that stays (its text and data; on SQLite its
full-text row is replaced, on PostgreSQL its `search_vec` computed again; its vector goes,
as it was made of the old text) and in a task that stays (inputs, checkpoint, result).
"""

import json

from store.forget.model import Plan, Sql, escaped, searchable
from store.read.plain import run
from store.records import dumps
from store.search import CJK_RANGES

MIN_CHARS = 8
CUT = "[forgotten]"


def quoted_texts(texts) -> list[str]:
    """The texts worth cutting, longest first (one inside another is cut whole)."""
    return sorted({t for t in texts if len(t.strip()) >= MIN_CHARS}, key=len, reverse=True)


def _cut(value, texts: list[str]):
    if isinstance(value, str):
        for t in texts:
            value = value.replace(t, CUT)
        return value
    if isinstance(value, list):
        return [_cut(v, texts) for v in value]
    if isinstance(value, dict):
        return {k: _cut(v, texts) for k, v in value.items()}
    return value


def _as_json(t: str) -> str:
    return json.dumps(t, ensure_ascii=False)[1:-1]


async def quoting(conn, dialect: str, p: Plan) -> tuple[list[int], list[str]]:
    """The entries and the tasks that stay and quote one of `p.quoted`."""
    if not p.quoted:
        return [], []
    entries: set[int] = set()
    tasks: set[str] = set()
    for t in p.quoted:
        q = Sql(dialect)
        said, written = "%" + escaped(t) + "%", "%" + escaped(_as_json(t)) + "%"
        entries |= {r.id for r in (await run(conn, (
            f"SELECT id FROM entries WHERE ({q.like('text', said)} OR "
            f"{q.like('data', written)}) AND NOT {q.isin('id', p.single)} AND NOT "
            f"{q.isin('conversation_id', p.conversations)}"), q.params)).all()}
        q = Sql(dialect)
        pattern = q.value(written)
        tasks |= {r.id for r in (await run(conn, (
            f"SELECT id FROM tasks WHERE (inputs LIKE {pattern} ESCAPE '\\' OR checkpoint "
            f"LIKE {pattern} ESCAPE '\\' OR result LIKE {pattern} ESCAPE '\\') AND NOT "
            f"{q.isin('id', p.tasks, 'text')}"), q.params)).all()}
    return sorted(entries), sorted(tasks)


def _cut_stored(raw: str | None, texts: list[str]) -> str | None:
    """A stored JSON value (or, if it is not JSON, text) with `texts` cut out."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return _cut(raw, texts)
    return dumps(_cut(value, texts))


async def cut(conn, dialect: str, p: Plan) -> None:
    """Cut `p.quoted` out of `p.quoting_entries` and `p.quoting_tasks`."""
    texts = p.quoted
    if not texts:
        return
    if p.quoting_entries:
        q = Sql(dialect)
        ids = q.isin("id", p.quoting_entries)
        if dialect == "sqlite":  # the old full-text rows out, by their exact text
            await run(conn, (
                "INSERT INTO entries_fts (entries_fts, rowid, text) SELECT 'delete', id, "
                f"coalesce(author || ' ', '') || text FROM entries WHERE {ids} AND "
                f"{searchable('instr')}"), q.params)
            await run(conn, (
                "INSERT INTO entries_cjk (entries_cjk, rowid, text) SELECT 'delete', id, "
                f"text || '  ' FROM entries WHERE {ids} AND {searchable('instr')} AND "
                f"text GLOB '*[{CJK_RANGES}]*'"), q.params)
        rows = (await run(conn, f"SELECT id, text, data FROM entries WHERE {ids}",
                          q.params)).all()
        for r in rows:
            params = {"id": r.id, "text": _cut(r.text, texts),
                      "data": _cut_stored(r.data, texts)}
            if dialect == "postgresql":
                await run(conn, (
                    "UPDATE entries SET text = :text, data = :data, search_vec = "
                    "steward_search_vector(kind, :data, author, :text) WHERE id = :id"), params)
            else:
                await run(conn, "UPDATE entries SET text = :text, data = :data WHERE id = :id",
                          params)
        if dialect == "sqlite":  # and the new ones in, as the insert trigger makes them
            await run(conn, (
                "INSERT INTO entries_fts (rowid, text) SELECT id, coalesce(author || ' ', '') "
                f"|| text FROM entries WHERE {ids} AND {searchable('instr')}"), q.params)
            await run(conn, (
                "INSERT INTO entries_cjk (rowid, text) SELECT id, text || '  ' FROM entries "
                f"WHERE {ids} AND {searchable('instr')} AND text GLOB '*[{CJK_RANGES}]*'"),
                q.params)
        await run(conn, f"DELETE FROM entry_vectors WHERE {q.isin('entry_id', p.quoting_entries)}",
                  q.params)
    for task_id in p.quoting_tasks:
        row = (await run(conn, "SELECT inputs, checkpoint, result FROM tasks WHERE id = :id",
                         {"id": task_id})).first()
        if row is None:
            continue
        values = {c: _cut_stored(getattr(row, c), texts)
                  for c in ("inputs", "checkpoint", "result")}
        await run(conn, ("UPDATE tasks SET inputs = :inputs, checkpoint = :checkpoint, "
                         "result = :result WHERE id = :id"), {**values, "id": task_id})
