"""Apply a `Writes` inside one open transaction. The caller owns the transaction, so either
all of it lands or none of it does.

Order matters: submissions first (a duplicate aborts the step before anything is written),
then entries (so documents can be tied to the positions they produce), tasks and usage,
all four the very statements of `store/steps.py`'s plan (stated once, in
store/step_sql.py); then documents and schedules, the task update, which wakes a waiting
parent when a child settles, withdrawals, and last the wakes of sleeping tasks.
"""

from sqlalchemy import select, update

from store import schedules as _schedules
from store.documents import versions
from store.records import PENDING, CommitResult, dumps, now
from store.schema import conversations, tasks
from store.steps import (
    DuplicateSubmission,
    inserts,
    on_connection,
    settle,
    wake_parent,
    wake_sleepers,
)
from store.writes import Writes

__all__ = ["DuplicateSubmission", "apply"]  # the first: where callers have always found it


async def apply(conn, dialect: str, writes: Writes) -> CommitResult:
    """A step of the common shape (`steps.fits`) is written by `store/steps.py` instead,
    in this same order."""
    result = CommitResult()
    t = now()
    last_seq = await on_connection(conn, dialect, inserts(writes, t, result))

    task_id = writes.task_update.task_id if writes.task_update else None
    for d in writes.documents:
        at_seq = None
        if d.conversation_id is not None:
            at_seq = last_seq.get(d.conversation_id)
            if at_seq is None:
                at_seq = (await conn.execute(select(conversations.c.last_seq).where(
                    conversations.c.id == d.conversation_id))).scalar_one()
        result.document_versions[(d.namespace, d.name)] = await versions.write(
            conn, dialect, d, at_seq=at_seq, task_id=task_id)

    for sw in writes.schedules:
        await _schedules.apply(conn, dialect, sw, t, DuplicateSubmission)

    locks = dialect == "postgresql"  # other writers: rows locked before the checks
    if writes.task_update is not None:
        await on_connection(conn, dialect, settle(writes, t, locks))

    if writes.withdrawals:
        await _withdraw_tasks(conn, dialect, writes, t)

    await on_connection(conn, dialect, wake_sleepers(writes, t))
    return result


async def _lock_rows(conn, task_ids: list[str], share: bool = False) -> None:
    """Serialise the tasks whose settling another's check depends on. Under PostgreSQL's
    read committed, two children finishing together each see the other still running and
    neither wakes the parent; with the parent's row locked first, the second one's check
    runs after the first commits. (SQLite has one writer, so it needs nothing.)"""
    if conn.dialect.name == "postgresql":
        await conn.execute(select(tasks.c.id).where(tasks.c.id.in_(task_ids))
                           .order_by(tasks.c.id).with_for_update(read=share))


# -- withdrawals: tasks finished before they ever ran (e.g. a deleted question) ------------


async def _withdraw_tasks(conn, dialect: str, writes: Writes, t: float) -> None:
    """Each withdrawn task moves from pending (in its phase) to done, without running, and
    only while it and its `unstarted` tasks are all still pending in that phase; otherwise
    the whole step is dropped. On PostgreSQL their rows are locked first (in id order, like
    a claim), so a worker claiming one either skips it until this step commits or has
    claimed it already, and then the check below sees it running."""
    from store.records import DONE  # here: this block stays apart from the rest

    await _lock_rows(conn, sorted({i for wd in writes.withdrawals
                                   for i in (wd.task_id, *wd.unstarted)}))
    for wd in writes.withdrawals:
        ids = {wd.task_id, *wd.unstarted}
        unstarted = (await conn.execute(select(tasks.c.id).where(
            tasks.c.id.in_(ids), tasks.c.state == PENDING, tasks.c.phase == wd.phase))).all()
        if len(unstarted) != len(ids):
            raise DuplicateSubmission(f"task {wd.task_id} started: not withdrawn")
        row = (await conn.execute(
            update(tasks).where(tasks.c.id == wd.task_id, tasks.c.state == PENDING)
            .values(state=DONE, result=dumps(wd.result), error=None, failure=None, run_after=0.0,
                    lease_owner=None, lease_expires=None, updated_at=t)
            .returning(tasks.c.parent_id))).one()
        if row.parent_id is not None:
            await on_connection(conn, dialect, wake_parent(row.parent_id, t,
                                                          dialect == "postgresql"))
