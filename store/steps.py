"""A step of the common shape as fixed statements on the driver: what an inbound message,
a phase of a turn, a tool call or a delivery writes (submissions, entries, new tasks,
usage, wakes, and the task's own update with the wake it owes). Built with SQLAlchemy on
every commit, such a step cost PostgreSQL ~5 ms of client time and round trips where the
statements take ~1.

The step is written once, as a plan: a generator that yields each statement and is sent
back what it returned. `on_sqlite` runs a plan on the writer thread's connection,
`on_postgres` on a hot-path asyncpg connection inside a transaction. Anything else a step
may hold (documents, schedules, withdrawals, spawns with a dedupe key, a sleeper's
`wake_if_settled`) goes through `store/commit.py`, which does the same in the
same order.
"""

from collections.abc import Generator

from store.commit import DuplicateSubmission, reservations
from store.errors import LeaseLost
from store.hotpath import (
    UPDATE_KNOWN_PARENT,
    UPDATE_SQL,
    WAKE_SQLITE,
    json_text,
    pg,
    update_params,
)
from store.records import PENDING, TERMINAL, WAITING, CommitResult
from store.schema import storable
from store.writes import TaskUpdate, Writes

# The same spelling on both: a unique (channel, external_id) that is already there inserts
# nothing and returns no row.
_SUBMISSION = """
INSERT INTO submissions (channel, external_id, conversation_id, task_id, state, reason,
                         payload, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (channel, external_id) DO NOTHING RETURNING id"""
# ?1 conversation, ?2 entries to add, ?3 now, ?4 offset of the last head marker among
# them (NULL: none). SET reads the old last_seq, as `commit._entries` does.
_SEQ = """
UPDATE conversations SET last_seq = last_seq + ?2, updated_at = ?3,
    head_seq = CASE WHEN CAST(?4 AS BIGINT) IS NULL THEN head_seq
                    ELSE last_seq + 1 + CAST(?4 AS BIGINT) END
WHERE id = ?1 RETURNING last_seq"""
_ENTRY = """
INSERT INTO entries (conversation_id, seq, kind, author, text, data, ref, task_id, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"""
_TASK = f"""
INSERT INTO tasks (id, kind, parent_id, conversation_id, state, phase, inputs, idem_key,
                   attempts, crashes, run_after, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, '{PENDING}', '', ?5, ?6, 0, 0, ?7, ?8, ?8)"""
_USAGE = """
INSERT INTO usage (task_id, conversation_id, provider, model, input_tokens, output_tokens,
                   cache_read_tokens, cache_write_tokens, cost_usd, ok, error, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"""
_WAKE_SLEEPER = (f"UPDATE tasks SET run_after = 0.0, updated_at = ?2 "
                 f"WHERE id = ?1 AND state = '{PENDING}'")
# PostgreSQL: the row of the parent a settling child may wake, locked before the check
# (`commit._lock_rows`: under read committed two children settling together would each see
# the other running). SQLite has one writer and skips it.
_LOCK = "SELECT id FROM tasks WHERE id = ?1 FOR UPDATE"

# What each yields: ("many", sql, rows) runs it for every row; ("row", sql, args) the first
# row or None; ("value", sql, args) its first column; ("count", sql, args) the rows
# changed; ("lock", sql, args) runs on PostgreSQL only; ("run", sql, args) nothing.
Op = tuple[str, str, object]


def fits(writes: Writes) -> bool:
    """Whether the step is of the common shape (and so `plan` writes all of it)."""
    u = writes.task_update
    return not (writes.documents or writes.schedules
                or writes.withdrawals or (u is not None and u.wake_if_settled)
                or any(nt.dedupe_key is not None for nt in writes.tasks))


def plan(writes: Writes, t: float, parent: str | None = "?") -> Generator[Op, object,
                                                                           CommitResult]:
    """The statements of a step that `fits`, in `commit.apply`'s order. `parent`: of the
    updated task, if known (None: it has none), "?" if not."""
    result = CommitResult()
    yield from _submissions(writes, t)
    yield from _entries(writes, t, result)
    if writes.tasks:
        yield ("many", _TASK, [
            (storable(nt.id), storable(nt.kind), nt.parent_id, nt.conversation_id,
             json_text(nt.inputs), None if nt.idem_key is None else storable(nt.idem_key),
             max(float(nt.run_after), t), t) for nt in writes.tasks])
        result.task_ids.extend(nt.id for nt in writes.tasks)
    task_id = writes.task_update.task_id if writes.task_update else None
    if writes.usage:
        yield ("many", _USAGE, [
            (u.task_id or task_id, u.conversation_id, storable(u.provider), storable(u.model),
             u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens,
             float(u.cost_usd), bool(u.ok), None if u.error is None else storable(u.error), t)
            for u in writes.usage])
    if (u := writes.task_update) is not None:
        yield from update(u, t, parent, spawned=any(nt.parent_id == u.task_id
                                                     for nt in writes.tasks))
    for sleeper in writes.wakes:  # after our own row, as in commit.apply
        yield ("run", _WAKE_SLEEPER, (sleeper, t))
    return result


def _submissions(writes: Writes, t: float):
    """Each external id once, ever: one seen before undoes the whole step."""
    seen = 0
    for sub in writes.submissions:
        state = "quarantined" if sub.quarantine_reason else "accepted"
        reason = None if sub.quarantine_reason is None else storable(sub.quarantine_reason)
        payload = None if sub.payload is None else json_text(sub.payload)
        for external_id in sub.external_ids:
            row = yield ("row", _SUBMISSION, (
                storable(sub.channel), storable(external_id), sub.conversation_id,
                None if sub.task_id is None else storable(sub.task_id), state, reason,
                payload, t))
            seen += row is None
    if seen:
        raise DuplicateSubmission(f"{seen} of {writes.submissions[0].channel}'s ids seen "
                                  "before")


def _entries(writes: Writes, t: float, result: CommitResult):
    if not writes.entries:
        return
    counts, heads = reservations(writes.entries)
    next_seq: dict[int, int] = {}
    for conversation_id in sorted(counts):  # one lock order for every writer
        n = counts[conversation_id]
        last = yield ("value", _SEQ, (conversation_id, n, t, heads.get(conversation_id)))
        if last is None:  # as SQLAlchemy's scalar_one() would have it
            raise LookupError(f"no conversation id {conversation_id}")
        next_seq[conversation_id] = last - n + 1
    rows = []
    for e in writes.entries:
        seq = next_seq[e.conversation_id]
        next_seq[e.conversation_id] = seq + 1
        rows.append((e.conversation_id, seq, storable(e.kind),
                     None if e.author is None else storable(e.author), storable(e.text),
                     None if e.data is None else json_text(e.data),
                     None if e.ref is None else storable(e.ref),
                     None if e.task_id is None else storable(e.task_id),
                     t if e.created_at is None else e.created_at))
        result.entry_seqs.append(seq)
    yield ("many", _ENTRY, rows)


def update(u: TaskUpdate, t: float, parent: str | None = "?", spawned: bool = False):
    """The fenced update of a task, then the wake it owes: its own (a wait whose children
    all settled already) or its parent's (the last child to settle). `spawned`: this step
    made children of the task, pending, so a wait for all of them is not over yet."""
    params = update_params(u, t)
    if parent == "?" and u.state in TERMINAL:
        row = yield ("row", UPDATE_SQL, params)
        if row is None:
            raise LeaseLost(u.task_id, u.owner)
        parent = row[0]
    elif (yield ("count", UPDATE_KNOWN_PARENT, params)) != 1:
        raise LeaseLost(u.task_id, u.owner)
    if u.state == WAITING:
        if not (spawned and u.wait_mode != "fail_fast"):
            yield ("run", WAKE_SQLITE, (u.task_id, t))
    elif u.state in TERMINAL and parent is not None:
        yield ("lock", _LOCK, (parent,))
        yield ("run", WAKE_SQLITE, (parent, t))


def on_sqlite(raw, steps: Generator[Op, object, CommitResult]) -> CommitResult:
    """Run a plan on an SQLite connection, in the caller's transaction."""
    answer = None
    try:
        while True:
            kind, sql, args = steps.send(answer)
            answer = None
            if kind == "many":
                raw.executemany(sql, args)
            elif kind != "lock":
                cur = raw.execute(sql, args)
                if kind == "count":
                    answer = cur.rowcount
                elif kind in ("row", "value"):
                    answer = cur.fetchone()
                    if kind == "value" and answer is not None:
                        answer = answer[0]
    except StopIteration as done:
        return done.value


_PG: dict[str, str] = {}  # each statement as asyncpg numbers its parameters


async def on_postgres(conn, steps: Generator[Op, object, CommitResult]) -> CommitResult:
    """Run a plan on an asyncpg connection, in the caller's transaction."""
    answer = None
    try:
        while True:
            kind, sql, args = steps.send(answer)
            answer = None
            if (text := _PG.get(sql)) is None:
                text = _PG[sql] = pg(sql)
            if kind == "many":
                await conn.executemany(text, args)
            elif kind == "row":
                answer = await conn.fetchrow(text, *args)
            elif kind == "value":
                answer = await conn.fetchval(text, *args)
            elif kind == "count":
                answer = int((await conn.execute(text, *args)).rsplit(" ", 1)[-1])
            else:
                await conn.execute(text, *args)
    except StopIteration as done:
        return done.value
