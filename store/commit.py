"""Apply a `Writes` inside one open transaction. The caller owns the transaction, so either
all of it lands or none of it does.

Order matters: submissions first (a duplicate aborts the step before anything is written),
then entries (so documents can be tied to the positions they produce), tasks, documents,
usage, then the task update, which wakes a waiting parent when a child settles, and last
the wakes of sleeping tasks.
"""

from sqlalchemy import and_, bindparam, exists, insert, not_, or_, select, update

from store import schedules as _schedules
from store.documents import versions
from store.errors import LeaseLost, StoreError
from store.records import (
    FAILED,
    PENDING,
    RUNNING,
    TERMINAL,
    WAITING,
    CommitResult,
    dumps,
    now,
)
from store.schema import conversations, entries, submissions, tasks, usage
from store.sql import insert_ignore
from store.writes import TaskUpdate, Writes


class DuplicateSubmission(StoreError):
    """Raised inside the transaction to roll the whole step back: the step (an inbound
    message, a schedule's occurrence) was already applied once. (`Store.commit` answers
    it as `CommitResult(duplicate=True)`; a connection it ends on is fine.)"""


async def apply(conn, dialect: str, writes: Writes) -> CommitResult:
    """A step of the common shape (`steps.fits`) is written by `store/steps.py` instead,
    in this same order."""
    result = CommitResult()
    t = now()
    await _submissions(conn, dialect, writes, t)
    last_seq = await _entries(conn, writes, t, result)

    for nt in writes.tasks:
        # Due from its creation at the earliest: claims take due work oldest-due first, so
        # a retry that came due earlier is not overtaken by every task made after it.
        values = dict(
            id=nt.id, kind=nt.kind, parent_id=nt.parent_id, conversation_id=nt.conversation_id,
            state=PENDING, phase="", inputs=dumps(nt.inputs), idem_key=nt.idem_key,
            dedupe_key=nt.dedupe_key, attempts=0, run_after=max(nt.run_after, t),
            created_at=t, updated_at=t)
        if nt.dedupe_key is None:
            await conn.execute(_INSERT_TASK, values)
            result.task_ids.append(nt.id)
            continue
        await conn.execute(insert_ignore(dialect, tasks, "dedupe_key").values(**values))
        result.task_ids.append((await conn.execute(
            select(tasks.c.id).where(tasks.c.dedupe_key == nt.dedupe_key))).scalar_one())

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

    for u in writes.usage:
        await conn.execute(insert(usage).values(
            task_id=u.task_id or task_id, conversation_id=u.conversation_id,
            provider=u.provider, model=u.model, input_tokens=u.input_tokens,
            output_tokens=u.output_tokens, cache_read_tokens=u.cache_read_tokens,
            cache_write_tokens=u.cache_write_tokens, cost_usd=u.cost_usd, ok=u.ok,
            error=u.error, created_at=t))

    for sw in writes.schedules:
        await _schedules.apply(conn, dialect, sw, t, DuplicateSubmission)

    if writes.task_update is not None:
        await _update_task(conn, writes.task_update, t)

    if writes.withdrawals:
        await _withdraw_tasks(conn, writes, t)

    # After our own row: a sleeper locks that row before its own (see `_update_task`).
    for task_id in writes.wakes:
        await conn.execute(update(tasks).where(tasks.c.id == task_id, tasks.c.state == PENDING)
                           .values(run_after=0.0, updated_at=t))
    return result


async def _submissions(conn, dialect: str, writes: Writes, t: float) -> None:
    """One statement for all of them; any row the unique key ignored is a duplicate."""
    rows = [dict(channel=sub.channel, external_id=external_id,
                 conversation_id=sub.conversation_id, task_id=sub.task_id,
                 state="quarantined" if sub.quarantine_reason else "accepted",
                 reason=sub.quarantine_reason,
                 payload=None if sub.payload is None else dumps(sub.payload), created_at=t)
            for sub in writes.submissions for external_id in sub.external_ids]
    if not rows:
        return
    stmt = insert_ignore(dialect, submissions, "channel", "external_id")
    if len(rows) == 1:  # the common live case: a plain statement, no executemany
        stmt = stmt.values(**rows[0])
        rows = None
    inserted = (await conn.execute(stmt.returning(submissions.c.id), rows)).all()
    if len(inserted) < (1 if rows is None else len(rows)):
        seen = (1 if rows is None else len(rows)) - len(inserted)
        raise DuplicateSubmission(f"{seen} of {writes.submissions[0].channel}'s ids seen before")


def reservations(new_entries) -> tuple[dict[int, int], dict[int, int]]:
    """How many positions each conversation takes, and the offset among them of its last
    head marker (for the conversations that get one)."""
    counts: dict[int, int] = {}
    heads: dict[int, int] = {}
    for e in new_entries:
        n = counts.get(e.conversation_id, 0)
        if e.head:
            heads[e.conversation_id] = n
        counts[e.conversation_id] = n + 1
    return counts, heads


async def _entries(conn, writes: Writes, t: float, result: CommitResult) -> dict[int, int]:
    """Reserve each conversation's sequence numbers with one update (the conversation row
    is its sequence, and its lock on PostgreSQL), then insert every entry in one statement,
    in the order given. Returns each conversation's last sequence number."""
    if not writes.entries:
        return {}
    counts, heads = reservations(writes.entries)
    last_seq: dict[int, int] = {}
    for conversation_id in sorted(counts):  # one lock order for every writer
        n = counts[conversation_id]
        moved = dict(last_seq=conversations.c.last_seq + n, updated_at=t)
        if conversation_id in heads:
            moved["head_seq"] = conversations.c.last_seq + 1 + heads[conversation_id]
        last_seq[conversation_id] = (await conn.execute(
            update(conversations).where(conversations.c.id == conversation_id)
            .values(**moved).returning(conversations.c.last_seq)
        )).scalar_one()
    next_seq = {c: last_seq[c] - counts[c] + 1 for c in counts}
    rows = []
    for e in writes.entries:
        seq = next_seq[e.conversation_id]
        next_seq[e.conversation_id] = seq + 1
        rows.append(dict(
            conversation_id=e.conversation_id, seq=seq, kind=e.kind, author=e.author,
            text=e.text, data=None if e.data is None else dumps(e.data), ref=e.ref,
            task_id=e.task_id, created_at=t if e.created_at is None else e.created_at))
        result.entry_seqs.append(seq)
    if len(rows) == 1:
        await conn.execute(insert(entries).values(**rows[0]))
    else:
        await conn.execute(insert(entries), rows)
    return last_seq


async def _update_task(conn, u: TaskUpdate, t: float) -> None:
    keep_lease = u.state == RUNNING
    values = dict(
        state=u.state, phase=u.phase,
        checkpoint=None if u.checkpoint is None else dumps(u.checkpoint),
        result=None if u.result is None else dumps(u.result), error=u.error,
        failure=u.failure, wait_mode=u.wait_mode, run_after=u.run_after, updated_at=t)
    if not keep_lease:
        values.update(lease_owner=None, lease_expires=None)
    if u.attempts is not None:
        values["attempts"] = u.attempts
    if u.progressed:
        values.update(crashes=0, crashed_since=None)
    if u.inputs is not None:
        values["inputs"] = dumps(u.inputs)
    if u.state == PENDING and u.wake_if_settled:
        # Before our own row, the same order a settling task takes (its row, then ours):
        # the check below then sees it settled, or its wake finds us pending.
        await _lock_rows(conn, u.wake_if_settled, share=True)
    # Fenced: only the worker holding the lease may move the task on.
    row = (await conn.execute(
        update(tasks).where(tasks.c.id == u.task_id, tasks.c.lease_owner == u.owner,
                            tasks.c.state == RUNNING)
        .values(**values).returning(tasks.c.parent_id)
    )).first()
    if row is None:
        raise LeaseLost(u.task_id, u.owner)
    if u.state == PENDING and u.wake_if_settled:
        other = tasks.alias("other")
        settled = exists().where(other.c.id.in_(u.wake_if_settled),
                                 other.c.state.in_(list(TERMINAL)))
        await conn.execute(update(tasks).where(tasks.c.id == u.task_id, settled)
                           .values(run_after=0.0))
    if u.state == WAITING:
        await wake_if_ready(conn, u.task_id, t)
    elif u.state in TERMINAL and row.parent_id is not None:
        await _lock_rows(conn, [row.parent_id])
        await wake_if_ready(conn, row.parent_id, t)


async def _lock_rows(conn, task_ids: list[str], share: bool = False) -> None:
    """Serialise the tasks whose settling another's check depends on. Under PostgreSQL's
    read committed, two children finishing together each see the other still running and
    neither wakes the parent; with the parent's row locked first, the second one's check
    runs after the first commits. (SQLite has one writer, so it needs nothing.)"""
    if conn.dialect.name == "postgresql":
        await conn.execute(select(tasks.c.id).where(tasks.c.id.in_(task_ids))
                           .order_by(tasks.c.id).with_for_update(read=share))


def _wake_statement():
    child = tasks.alias("child")
    unsettled = exists().where(child.c.parent_id == tasks.c.id,
                               child.c.state.not_in(list(TERMINAL)))
    failed_child = exists().where(child.c.parent_id == tasks.c.id, child.c.state == FAILED)
    fail_fast = and_(tasks.c.wait_mode == "fail_fast", failed_child)
    return (update(tasks).where(tasks.c.id == bindparam("waiting"), tasks.c.state == WAITING,
                                or_(not_(unsettled), fail_fast))
            .values(state=PENDING, run_after=0.0, updated_at=bindparam("at")))


# Built once: making them anew cost more than running them (an alias, two EXISTS).
_WAKE = _wake_statement()
_INSERT_TASK = insert(tasks)


async def wake_if_ready(conn, task_id: str, t: float) -> None:
    """Move a waiting task back to pending when its wait is over: every child settled
    (mode `all`), or any child failed (mode `fail_fast`)."""
    await conn.execute(_WAKE, {"waiting": task_id, "at": t})


# -- withdrawals: tasks finished before they ever ran (e.g. a deleted question) ------------


async def _withdraw_tasks(conn, writes: Writes, t: float) -> None:
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
            await _lock_rows(conn, [row.parent_id])
            await wake_if_ready(conn, row.parent_id, t)
