"""Taking out what a plan lists (store/forget), in the transaction that selected it."""

import hashlib
import time

from store.documents import scrub
from store.forget import redact
from store.forget.model import (
    FORGOTTEN,
    Plan,
    Sql,
    Target,
    Touched,
    removed_entries,
    searchable,
)
from store.read.plain import run
from store.records import dumps
from store.search import CJK_RANGES


async def apply(conn, dialect: str, t: Target, p: Plan) -> int:
    """Remove what `p` lists (selected in this transaction); returns the record's id."""
    now = time.time()
    if dialect == "sqlite":  # a contentless FTS5 row goes by its exact indexed text
        q = Sql(dialect)
        removed = removed_entries(q, p)
        await run(conn, (
            "INSERT INTO entries_fts (entries_fts, rowid, text) SELECT 'delete', id, "
            f"coalesce(author || ' ', '') || text FROM entries WHERE {removed} AND "
            f"{searchable('instr')}"), q.params)
        await run(conn, (
            "INSERT INTO entries_cjk (entries_cjk, rowid, text) SELECT 'delete', id, "
            f"text || '  ' FROM entries WHERE {removed} AND {searchable('instr')} AND "
            f"text GLOB '*[{CJK_RANGES}]*'"), q.params)
    q = Sql(dialect)
    await run(conn, f"DELETE FROM entry_vectors WHERE entry_id IN (SELECT id FROM entries "
                    f"WHERE {removed_entries(q, p)})", q.params)
    q = Sql(dialect)
    await run(conn, (
        f"UPDATE submissions SET conversation_id = NULL, task_id = NULL, payload = NULL, "
        f"reason = NULL, state = '{FORGOTTEN}' WHERE {q.isin('id', p.tombstones)}"), q.params)
    q = Sql(dialect)
    await run(conn, f"DELETE FROM submissions WHERE {q.isin('id', p.deleted_submissions)}",
              q.params)
    q = Sql(dialect)
    await run(conn, f"DELETE FROM schedules WHERE {q.isin('id', p.schedules, 'text')}",
              q.params)
    q = Sql(dialect)
    await run(conn, (
        f"UPDATE usage SET conversation_id = NULL, task_id = NULL, error = NULL WHERE "
        f"{q.isin('conversation_id', p.conversations)} OR "
        f"{q.isin('task_id', p.tasks, 'text')}"), q.params)
    # documents: whole, then those that stay rewritten without what went
    q = Sql(dialect)
    await run(conn, f"UPDATE documents SET forked_from = NULL WHERE "
                    f"{q.isin('forked_from', p.documents)}", q.params)
    for table, column in (("document_versions", "document_id"), ("documents", "id")):
        q = Sql(dialect)
        await run(conn, f"DELETE FROM {table} WHERE {q.isin(column, p.documents)}", q.params)
    lost: dict[int, scrub.Scrub] = {}
    for doc in p.scrubbed:  # sources before their forks' copies (locked by the selection)
        inherited = lost.get(p.copied_from.get(doc), scrub.Scrub())
        lost[doc] = await scrub.rewrite(conn, doc, set(p.conversations), p.tasks, inherited)
    # tasks (children first: each loses its parent, then all go)
    q = Sql(dialect)
    await run(conn, f"UPDATE tasks SET parent_id = NULL WHERE {q.isin('id', p.tasks, 'text')}",
              q.params)
    q = Sql(dialect)
    await run(conn, f"DELETE FROM tasks WHERE {q.isin('id', p.tasks, 'text')}", q.params)
    q = Sql(dialect)
    await run(conn, f"DELETE FROM entries WHERE {removed_entries(q, p)}", q.params)
    for channel, event_id in p.inbound:
        await run(conn, "DELETE FROM inbound WHERE channel = :c AND event_id = :e",
                  {"c": channel, "e": event_id})
    q = Sql(dialect)
    await run(conn, f"UPDATE conversations SET parent_id = NULL WHERE "
                    f"{q.isin('id', p.conversations)}", q.params)
    q = Sql(dialect)
    await run(conn, f"DELETE FROM conversations WHERE {q.isin('id', p.conversations)}",
              q.params)
    await redact.cut(conn, dialect, p)
    for cid, touch in sorted(p.touched.items()):
        await _note(conn, cid, touch, t, now)
    counts = p.counts()
    row = (await run(conn, (
        "INSERT INTO forgotten (kind, target, counts, blobs, created_at) VALUES "
        "(:kind, :target, :counts, :blobs, :t) RETURNING id"),
        {"kind": t.kind, "target": digest(t.name), "counts": dumps(counts),
         "blobs": dumps(p.blobs) if p.blobs else None, "t": now})).one()
    return row.id


async def _note(conn, cid: int, touch: Touched, t: Target, now: float) -> None:
    """The note in a conversation that stays: which positions it no longer has (a live
    worker's cached context drops them when it reads the note), and its head marker moved
    back if its summary went."""
    seq = (await run(conn, (
        "UPDATE conversations SET last_seq = last_seq + 1, updated_at = :t WHERE id = :c "
        "RETURNING last_seq"), {"t": now, "c": cid})).one()[0]
    await run(conn, (
        "INSERT INTO entries (conversation_id, seq, kind, text, data, created_at) VALUES "
        "(:c, :s, 'system', :text, :data, :t)"),
        {"c": cid, "s": seq, "text": t.note, "t": now,
         "data": dumps({t.withdraw_key: sorted(touch.seqs), "forgotten": True})})
    if touch.moves_head:
        await run(conn, "UPDATE conversations SET head_seq = :h WHERE id = :c",
                  {"h": touch.new_head, "c": cid})


def digest(name: str) -> str:
    """What the record keeps of a target's name: anyone who knows the name can check it
    was forgotten; the table does not list whom."""
    return hashlib.sha256(name.encode()).hexdigest()


