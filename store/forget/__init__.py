"""Forgetting: a conversation or a person taken out of the store everywhere, in one
transaction, with a record that it happened (table `forgotten`, migration 0017) that holds
no word of what went. `bot/app/forget.py` says who a person is (a `Target`: data, so the
store needs to know nothing of people, channels or tools); this module finds everything
that is theirs (`plan`, also the dry run) and removes it (`forget`). The space their words
took is reclaimed afterwards (store/reclaim.py).

What a target takes, in one transaction (`_apply`, in this order):

- conversations: by key, owner or scope, with every fork of them (a fork reads its parent's
  entries: it holds them too), their entries, and each entry's search row (SQLite: an FTS5
  `delete` of the exact text the trigger indexed, in `entries_fts` and `entries_cjk`;
  PostgreSQL: `search_vec` goes with the row) and vectors (`entry_vectors`);
- single entries in conversations that stay (a person's messages in a shared channel):
  those written by their tasks (the turns they asked: `askers`), by their name (`authors`),
  or marked theirs in their data (`marks`), the notes a channel keeps about those
  (`notes`: an edit, a deletion); and every summary (compaction) written after the first
  of them, which may repeat what they said: the head marker moves back to the newest
  summary left (the next turn summarises again, without them). Each such conversation (and
  each fork that saw them) gets a `system` entry saying so, whose data lists the removed
  positions under `withdraw_key`, so a context a live worker holds drops them too;
- tasks: all of those conversations' and of the turns that were theirs, with every task
  below them, whatever their state (a pinned request, a result, a checkpoint may quote
  them). A worker running one finds it gone at its next commit (`LeaseLost`, or no
  conversation for its entries) and drops it; it never crashes the runner. On PostgreSQL
  the rows are locked first (conversations, then tasks, level by level), so no worker adds
  a child or an entry under them meanwhile;
- documents: the conversations' own (`conversation:<id>`) and `namespaces` (the person's
  facts), every version. A document that stays but was edited by what goes (a shared
  channel's facts, a to-do list), and every copy a fork took of it, loses the items those
  edits added or changed, and its history (store/documents/scrub.py); the exact texts of
  those items are cut out of the entries and tasks that stay and quote them (a tool's
  listing in someone else's turn: redact.py);
- submissions of what goes are kept as tombstones, (channel, external id) and nothing else,
  so an event delivered again, a mail found again or an import run again never brings the
  forgotten messages back; the budget's notes and places named after the person
  (`submission_keys`) are deleted; quarantined events and the shared inbound journal's
  events that name them (`payload_marks`) go too;
- schedules of those conversations and of the person (`schedule_owners`);
- usage rows stay (spend totals must not change), detached from what went;
- attachment blobs only the removed entries referred to are listed in the record, for the
  caller to delete (`pending`, `blobs_removed`): the store does not know the home.

Ids: PostgreSQL never gives an id twice; SQLite may give a deleted conversation's id to the
next one, so nothing that stays names a removed conversation (usage, document versions and
submissions are detached; everything else that named it is gone).

What it cannot see: words of theirs said again in other words (a summary is removed, an
answer to someone else that paraphrases them stays), an excerpt of them in a search tool's
result in someone else's turn, and a request a live worker holds in memory.

    model.py    Target, Plan, Record, and the SQL pieces both sides use
    select.py   what a target takes (the dry run, and again in the deleting transaction)
    apply.py    taking it out
    redact.py   cutting the texts of forgotten items out of what quotes them
"""

from store.forget.apply import apply, digest
from store.forget.model import DataMark, Plan, Record, Sql, Target, decoded, escaped, rows_of
from store.forget.select import BLOB, BLOB_LIKE, select
from store.read.plain import run

__all__ = ["DataMark", "Plan", "Record", "Target", "blobs_removed", "digest", "forget",
           "literal", "pending", "plan", "records", "referenced"]

_TRIES = 3  # PostgreSQL: a deadlock with a live worker's step is retried


def literal(text: str) -> str:
    """`text` as it reads in a LIKE pattern of a `Target` (`submission_keys`)."""
    return escaped(text)


async def plan(store, target: Target) -> Plan:
    """What `forget` would take now (the dry run): nothing is written."""
    async with store.reading() as conn:
        return await select(conn, store.dialect, target, lock=False)


async def forget(store, target: Target) -> tuple[Plan, int]:
    """Take `target` out, in one transaction: what it took (selected afresh inside it) and
    the id of its record in `forgotten`."""
    async def job(conn):
        p = await select(conn, store.dialect, target, lock=True)
        return p, await apply(conn, store.dialect, target, p)

    for attempt in range(_TRIES):
        try:
            return await store._write(job)
        except Exception as exc:  # PostgreSQL: a deadlock with a live worker's step
            if attempt + 1 == _TRIES or _sqlstate(exc) not in ("40P01", "40001"):
                raise
    raise AssertionError("unreachable")


def _sqlstate(exc: BaseException) -> str | None:
    for e in (exc, getattr(exc, "orig", None), exc.__cause__):
        code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
        if code:
            return code
    return None


async def pending(store) -> list[Record]:
    """Records whose clean-up is not finished: blobs still to delete, or space not yet
    reclaimed (a process that stopped half-way; the next forget finishes it)."""
    return await _records(store, "WHERE blobs IS NOT NULL OR reclaimed_at IS NULL ")


async def records(store) -> list[Record]:
    """Every forget this store has seen, oldest first."""
    return await _records(store, "")


async def _records(store, where: str) -> list[Record]:
    async with store.reading() as conn:
        rows = await rows_of(conn, (
            "SELECT id, kind, target, counts, blobs, created_at, reclaimed_at FROM forgotten "
            f"{where}ORDER BY id"))
    return [Record(r.id, r.kind, r.target, decoded(r.counts) or {}, decoded(r.blobs) or [],
                   r.created_at, r.reclaimed_at) for r in rows]


async def blobs_removed(store, record_id: int) -> None:
    """The record's blobs are deleted: it no longer lists them."""
    await store._write(lambda conn: run(
        conn, "UPDATE forgotten SET blobs = NULL WHERE id = :id", {"id": record_id}))


async def referenced(store, digests: list[str]) -> set[str]:
    """Of `digests`, those an entry refers to now (one a later message brought back)."""
    if not digests:
        return set()
    async with store.reading() as conn:
        q = Sql(store.dialect)
        rows = await rows_of(conn, f"SELECT data FROM entries WHERE {q.like('data', BLOB_LIKE)}",
                             q.params)
    wanted = set(digests)
    return {d for r in rows for d in BLOB.findall(r.data or "") if d in wanted}
