"""A step of the common shape, as one plan both backends execute: what an inbound
message, a phase of a turn, a tool call or a delivery writes (submissions, entries, new
tasks, deliveries, usage, wakes, and the task's own update with the wake it owes). Built
with SQLAlchemy on every commit, such a step cost PostgreSQL ~5 ms of client time and round
trips where the statements take ~1.

The statements are stated once (store/step_sql.py, store/hotpath.py). On SQLite the plan
is a generator that yields each statement and is sent back what it returned, run by
`on_sqlite` on the writer thread's connection. On PostgreSQL the same statements, in the
same order, are one call of `steward_step`, generated from them
(store/postgres/step_function.py). A step that holds more (documents, schedules,
withdrawals) goes through `store/commit.py`, whose inserts are this plan's own (`inserts`,
run on its SQLAlchemy connection by `on_connection`): a column is added in one place.
"""

from collections.abc import Generator
from functools import lru_cache

from store.errors import LeaseLost, StoreError
from store.hotpath import (
    UPDATE_KNOWN_PARENT,
    UPDATE_SQL,
    WAKE_WAITING,
    json_text,
    pg,
    update_params,
)
from store.records import PENDING, TERMINAL, WAITING, CommitResult
from store.schema import storable
from store.step_sql import (
    ENTRIES,
    SEQ,
    SUBMISSIONS,
    TASKS,
    USAGE,
    WAKE_IF_SETTLED,
    WAKE_SLEEPERS,
    bind,
)
from store.writes import TaskUpdate, Writes

# A unique (channel, external_id) that is already there inserts nothing and returns no row.
_SUBMISSION = SUBMISSIONS.sqlite(
    tail="\nON CONFLICT (channel, external_id) DO NOTHING RETURNING id")
_ENTRY = ENTRIES.sqlite(("conversation_id", "seq"))
_TASK = TASKS.sqlite()
# A spawn with a dedupe key (a delivery): nothing if that key is there already, and the
# id of whichever task holds it is the spawn's.
_TASK_DEDUPE = TASKS.sqlite(tail="\nON CONFLICT (dedupe_key) DO NOTHING",
                           trail=("dedupe_key",))
_DEDUPED = "SELECT id FROM tasks WHERE dedupe_key = ?1"
_WAKE_IF_SETTLED = WAKE_IF_SETTLED.format(those="IN (SELECT value FROM json_each(?2))")
_USAGE = USAGE.sqlite()
_WAKE_SLEEPER = WAKE_SLEEPERS.format(ids="= ?1")
# With several writers (PostgreSQL: `commit.apply` there) a check that reads other tasks'
# states first locks their rows, as `steward_step` does: see `_update`.
_SHARE_TASKS = "SELECT 1 FROM tasks WHERE id = ANY(?1) ORDER BY id FOR SHARE"
_LOCK_TASK = "SELECT 1 FROM tasks WHERE id = ?1 FOR UPDATE"
_WAKE_IF_SETTLED_PG = WAKE_IF_SETTLED.format(those="= ANY(?2)")

# What each yields: ("many", sql, rows) runs it for every row; ("row", sql, args) the first
# row or None; ("value", sql, args) its first column; ("count", sql, args) the rows
# changed; ("run", sql, args) nothing.
Op = tuple[str, str, object]


class DuplicateSubmission(StoreError):
    """Raised inside the transaction to roll the whole step back: the step (an inbound
    message, a schedule's occurrence) was already applied once. (`Store.commit` answers
    it as `CommitResult(duplicate=True)`; a connection it ends on is fine.)"""


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


def fits(writes: Writes) -> bool:
    """Whether the step is of the common shape (and so `plan` writes all of it)."""
    return not (writes.documents or writes.schedules or writes.withdrawals)


# -- the rows, the same for both -----------------------------------------------------------


def submission_rows(writes: Writes) -> list[tuple]:
    """`step_sql.SUBMISSIONS`' columns: one row per external id."""
    return [SUBMISSIONS.row(sub, x) for sub in writes.submissions for x in sub.external_ids]


def _duplicates(writes: Writes, seen: int) -> DuplicateSubmission:
    return DuplicateSubmission(f"{seen} of {writes.submissions[0].channel}'s ids seen before")


def entry_rows(writes: Writes, t: float) -> list[tuple]:
    """(conversation, *`step_sql.ENTRIES`' columns): one per entry, in the order given; its
    position is the conversation's next."""
    return [(e.conversation_id, *ENTRIES.row(e, t)) for e in writes.entries]


def task_rows(writes: Writes, t: float) -> list[tuple]:
    """(*`step_sql.TASKS`' columns, dedupe key)."""
    return [(*TASKS.row(nt, t), None if nt.dedupe_key is None else storable(nt.dedupe_key))
            for nt in writes.tasks]


def usage_rows(writes: Writes) -> list[tuple]:
    task_id = writes.task_update.task_id if writes.task_update else None
    return [USAGE.row(u, task_id) for u in writes.usage]


def wakes_self(u: TaskUpdate, writes: Writes) -> bool:
    """Whether a waiting task is to be woken at once (its wait may be over already). Not
    when it waits for all of the children this very step spawned: they are pending (a
    spawn with a dedupe key may have found an older task, settled or not)."""
    if u.state != WAITING:
        return False
    spawned = any(nt.parent_id == u.task_id and nt.dedupe_key is None for nt in writes.tasks)
    return not (spawned and u.wait_mode != "fail_fast")


# -- the plan, and SQLite's run of it on the writer's connection ------------------------


def plan(writes: Writes, t: float, parent: str | None = "?") -> Generator[Op, object,
                                                                           CommitResult]:
    """The statements of a step that `fits`, in `commit.apply`'s order. `parent`: of the
    updated task, if known (None: it has none), "?" if not."""
    result = CommitResult()
    yield from inserts(writes, t, result)
    if (u := writes.task_update) is not None:
        yield from _update(u, t, parent, wakes_self(u, writes))
    yield from wake_sleepers(writes, t)
    return result


def settle(writes: Writes, t: float, locks: bool) -> Generator[Op, object, None]:
    """The task update of a step that does not `fit` and the wake it owes, as `plan`
    makes them; `locks`: there are other writers (PostgreSQL), so rows are locked first."""
    u = writes.task_update
    yield from _update(u, t, "?", wakes_self(u, writes), locks)


def wake_sleepers(writes: Writes, t: float) -> Generator[Op, object, None]:
    """Sleepers woken early, after the step's own row (a sleeper locks that row first)."""
    for sleeper in writes.wakes:
        yield ("run", _WAKE_SLEEPER, (sleeper, t, PENDING))


def wake_parent(parent: str, t: float, locks: bool) -> Generator[Op, object, None]:
    """The wake a settling child owes its parent: pending again if its wait is over. With
    other writers the parent is locked first: two children settling together would each
    see the other running, and neither wake it."""
    if locks:
        yield ("run", _LOCK_TASK, (parent,))
    yield ("run", WAKE_WAITING, (parent, t))


def inserts(writes: Writes, t: float, result: CommitResult) -> Generator[Op, object,
                                                                          dict[int, int]]:
    """What every step inserts, whichever path writes it: its submissions (a duplicate
    undoes the step before anything else is written), the positions its entries take and
    the entries, its new tasks, its usage. Fills `result`'s entry positions and task ids;
    returns each conversation's last position."""
    seen = 0
    for row in submission_rows(writes):  # each external id once, ever
        seen += (yield ("row", _SUBMISSION, (*row, t))) is None
    if seen:  # one seen before undoes the whole step
        raise _duplicates(writes, seen)
    last_seq: dict[int, int] = {}
    if writes.entries:
        counts, heads = reservations(writes.entries)
        next_seq: dict[int, int] = {}
        for conversation_id in sorted(counts):  # one lock order for every writer
            n = counts[conversation_id]
            last = yield ("value", SEQ, (conversation_id, n, t, heads.get(conversation_id)))
            if last is None:  # as SQLAlchemy's scalar_one() would have it
                raise LookupError(f"no conversation id {conversation_id}")
            last_seq[conversation_id] = last
            next_seq[conversation_id] = last - n + 1
        rows = []
        for conversation_id, *rest in entry_rows(writes, t):
            seq = next_seq[conversation_id]
            next_seq[conversation_id] = seq + 1
            rows.append((conversation_id, seq, *rest))
            result.entry_seqs.append(seq)
        yield ("many", _ENTRY, rows)
    if writes.tasks:
        # Each due from its creation at the earliest (`step_sql.TASKS`' run_after): claims
        # take due work oldest-due first, so a retry that came due earlier is not overtaken
        # by every task made after it.
        rows = task_rows(writes, t)
        if all(row[-1] is None for row in rows):
            yield ("many", _TASK, [(*row[:-1], t) for row in rows])
            result.task_ids.extend(nt.id for nt in writes.tasks)
        else:  # in order, each deduped one as it goes
            for row in rows:
                if row[-1] is None:
                    yield ("run", _TASK, (*row[:-1], t))
                    result.task_ids.append(row[0])
                else:
                    yield ("run", _TASK_DEDUPE, (*row[:-1], t, row[-1]))
                    result.task_ids.append((yield ("value", _DEDUPED, (row[-1],))))
    if writes.usage:
        yield ("many", _USAGE, [(*row, t) for row in usage_rows(writes)])
    return last_seq


def _update(u: TaskUpdate, t: float, parent: str | None, wake_self: bool,
            locks: bool = False):
    """The fenced update of a task, then the wake it owes: its own (a wait whose children
    all settled already) or its parent's (the last child to settle). With `locks` (other
    writers), a sleeper that waits for other tasks locks them before its own row, the
    order a settling task takes (its row, then ours): its check then sees one settled, or
    that task's wake finds it pending."""
    waits_for = list(u.wake_if_settled) if u.state == PENDING and u.wake_if_settled else None
    if waits_for and locks:
        yield ("run", _SHARE_TASKS, (waits_for,))
    params = update_params(u, t)
    if parent == "?" and u.state in TERMINAL:
        row = yield ("row", UPDATE_SQL, params)
        if row is None:
            raise LeaseLost(u.task_id, u.owner)
        parent = row[0]
    elif (yield ("count", UPDATE_KNOWN_PARENT, params)) != 1:
        raise LeaseLost(u.task_id, u.owner)
    if waits_for and locks:
        yield ("run", _WAKE_IF_SETTLED_PG, (u.task_id, waits_for))
    elif waits_for:  # one writer: no lock needed first
        yield ("run", _WAKE_IF_SETTLED, (u.task_id, json_text(waits_for)))
    if wake_self:
        yield ("run", WAKE_WAITING, (u.task_id, t))
    elif u.state in TERMINAL and parent is not None:
        yield from wake_parent(parent, t, locks)


def on_sqlite(raw, steps: Generator[Op, object, CommitResult]) -> CommitResult:
    """Run a plan on an SQLite connection, in the caller's transaction."""
    answer = None
    try:
        while True:
            kind, sql, args = steps.send(answer)
            answer = None
            if kind == "many":
                raw.executemany(sql, args)
            else:
                cur = raw.execute(sql, args)
                if kind == "count":
                    answer = cur.rowcount
                elif kind in ("row", "value"):
                    answer = cur.fetchone()
                    if kind == "value" and answer is not None:
                        answer = answer[0]
    except StopIteration as done:
        return done.value


# asyncpg prepares each statement alone, where a parameter only ever tested for NULL has
# no type (in `steward_step` it is a typed argument): SEQ's head offset is cast.
_PG = {SEQ: bind(SEQ, ["$1", "$2", "$3", "CAST($4 AS bigint)"])}


@lru_cache(maxsize=32)
def _pg(sql: str) -> str:
    return pg(sql)


async def on_connection(conn, dialect: str, steps: Generator[Op, object, object]):
    """Run a plan's statements on a SQLAlchemy connection (`store/commit.py`'s), in its
    transaction: the text as it is on SQLite, numbered for asyncpg on PostgreSQL."""
    answer = None
    try:
        while True:
            kind, sql, args = steps.send(answer)
            cur = await conn.exec_driver_sql(_PG.get(sql) or _pg(sql)
                                             if dialect == "postgresql" else sql, args)
            answer = None
            if kind == "count":
                answer = cur.rowcount
            elif kind in ("row", "value"):
                answer = cur.first()
                if kind == "value" and answer is not None:
                    answer = answer[0]
    except StopIteration as done:
        return done.value
