"""A step of the common shape as fixed statements: what an inbound message, a phase of a
turn, a tool call or a delivery writes (submissions, entries, new tasks, deliveries, usage,
wakes, and the task's own update with the wake it owes). Built with SQLAlchemy on every
commit, such a step cost PostgreSQL ~5 ms of client time and round trips where the
statements take ~1.

On SQLite the step is a plan, a generator that yields each statement and is sent back
what it returned, run by `on_sqlite` on the writer thread's connection. On PostgreSQL the
same statements, in the same order, are one call of `steward_step` (migration 0015): one
round trip, autocommitted, where the client's statements were six or seven, and the claim
that takes the step's slot rides in it (`on_postgres`). Both are fed the same rows
(`_submission_rows` ... `_usage_rows`). Anything else a step may hold (documents,
schedules, withdrawals) goes through `store/commit.py`, which does the same in the same
order.
"""

from collections.abc import Generator

from store.commit import DuplicateSubmission, reservations
from store.errors import LeaseLost
from store.hotpath import (
    UPDATE_KNOWN_PARENT,
    UPDATE_SQL,
    WAKE_SQLITE,
    claim_params,
    claimed_tasks,
    json_text,
    update_params,
)
from store.records import PENDING, TERMINAL, WAITING, CommitResult
from store.schema import storable
from store.writes import Claim, TaskUpdate, Writes

# A unique (channel, external_id) that is already there inserts nothing and returns no row.
_SUBMISSION = """
INSERT INTO submissions (channel, external_id, conversation_id, task_id, state, reason,
                         payload, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
ON CONFLICT (channel, external_id) DO NOTHING RETURNING id"""
# ?1 conversation, ?2 entries to add, ?3 now, ?4 offset of the last head marker among
# them (NULL: none). SET reads the old last_seq, as `commit._entries` does.
_SEQ = """
UPDATE conversations SET last_seq = last_seq + ?2, updated_at = ?3,
    head_seq = CASE WHEN ?4 IS NULL THEN head_seq ELSE last_seq + 1 + ?4 END
WHERE id = ?1 RETURNING last_seq"""
_ENTRY = """
INSERT INTO entries (conversation_id, seq, kind, author, text, data, ref, task_id, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"""
_TASK = f"""
INSERT INTO tasks (id, kind, parent_id, conversation_id, state, phase, inputs, idem_key,
                   attempts, crashes, run_after, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, '{PENDING}', '', ?5, ?6, 0, 0, ?7, ?8, ?8)"""
# A spawn with a dedupe key (a delivery): nothing if that key is there already, and the
# id of whichever task holds it is the spawn's.
_TASK_DEDUPE = f"""
INSERT INTO tasks (id, kind, parent_id, conversation_id, state, phase, inputs, idem_key,
                   attempts, crashes, run_after, created_at, updated_at, dedupe_key)
VALUES (?1, ?2, ?3, ?4, '{PENDING}', '', ?5, ?6, 0, 0, ?7, ?8, ?8, ?9)
ON CONFLICT (dedupe_key) DO NOTHING"""
_DEDUPED = "SELECT id FROM tasks WHERE dedupe_key = ?1"
# A sleeper that waits for other tasks (a turn for the older one) is due at once if any of
# them settled before it went to sleep: ?1 the sleeper, ?2 those tasks (a JSON list).
_WAKE_IF_SETTLED = f"""
UPDATE tasks SET run_after = 0.0 WHERE id = ?1 AND EXISTS (
    SELECT 1 FROM tasks o WHERE o.id IN (SELECT value FROM json_each(?2))
    AND o.state IN ({", ".join(f"'{s}'" for s in sorted(TERMINAL))}))"""
_USAGE = """
INSERT INTO usage (task_id, conversation_id, provider, model, input_tokens, output_tokens,
                   cache_read_tokens, cache_write_tokens, cost_usd, ok, error, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)"""
_WAKE_SLEEPER = (f"UPDATE tasks SET run_after = 0.0, updated_at = ?2 "
                 f"WHERE id = ?1 AND state = '{PENDING}'")

# What each yields: ("many", sql, rows) runs it for every row; ("row", sql, args) the first
# row or None; ("value", sql, args) its first column; ("count", sql, args) the rows
# changed; ("run", sql, args) nothing.
Op = tuple[str, str, object]


def fits(writes: Writes) -> bool:
    """Whether the step is of the common shape (and so `plan` writes all of it)."""
    return not (writes.documents or writes.schedules or writes.withdrawals)


# -- the rows, the same for both ---------------------------------------------------------


def _submission_rows(writes: Writes) -> list[tuple]:
    """(channel, external id, conversation, task, state, reason, payload): one per id."""
    rows = []
    for sub in writes.submissions:
        state = "quarantined" if sub.quarantine_reason else "accepted"
        reason = None if sub.quarantine_reason is None else storable(sub.quarantine_reason)
        payload = None if sub.payload is None else json_text(sub.payload)
        channel = storable(sub.channel)
        task = None if sub.task_id is None else storable(sub.task_id)
        rows.extend((channel, storable(external_id), sub.conversation_id, task, state,
                     reason, payload) for external_id in sub.external_ids)
    return rows


def _duplicates(writes: Writes, seen: int) -> DuplicateSubmission:
    return DuplicateSubmission(f"{seen} of {writes.submissions[0].channel}'s ids seen before")


def _entry_rows(writes: Writes, t: float) -> list[tuple]:
    """(conversation, kind, author, text, data, ref, task, created): one per entry, in the
    order given; its position is the conversation's next."""
    return [(e.conversation_id, storable(e.kind),
             None if e.author is None else storable(e.author), storable(e.text),
             None if e.data is None else json_text(e.data),
             None if e.ref is None else storable(e.ref),
             None if e.task_id is None else storable(e.task_id),
             t if e.created_at is None else e.created_at) for e in writes.entries]


def _task_rows(writes: Writes, t: float) -> list[tuple]:
    """(id, kind, parent, conversation, inputs, idempotency key, run after, dedupe key)."""
    return [(storable(nt.id), storable(nt.kind), nt.parent_id, nt.conversation_id,
             json_text(nt.inputs), None if nt.idem_key is None else storable(nt.idem_key),
             max(float(nt.run_after), t),
             None if nt.dedupe_key is None else storable(nt.dedupe_key))
            for nt in writes.tasks]


def _usage_rows(writes: Writes) -> list[tuple]:
    task_id = writes.task_update.task_id if writes.task_update else None
    return [(u.task_id or task_id, u.conversation_id, storable(u.provider), storable(u.model),
             u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens,
             float(u.cost_usd), bool(u.ok), None if u.error is None else storable(u.error))
            for u in writes.usage]


def _wakes_self(u: TaskUpdate, writes: Writes) -> bool:
    """Whether a waiting task is to be woken at once (its wait may be over already). Not
    when it waits for all of the children this very step spawned: they are pending (a
    spawn with a dedupe key may have found an older task, settled or not)."""
    if u.state != WAITING:
        return False
    spawned = any(nt.parent_id == u.task_id and nt.dedupe_key is None for nt in writes.tasks)
    return not (spawned and u.wait_mode != "fail_fast")


# -- SQLite: the plan, on the writer's connection ----------------------------------------


def plan(writes: Writes, t: float, parent: str | None = "?") -> Generator[Op, object,
                                                                           CommitResult]:
    """The statements of a step that `fits`, in `commit.apply`'s order. `parent`: of the
    updated task, if known (None: it has none), "?" if not."""
    result = CommitResult()
    seen = 0
    for row in _submission_rows(writes):  # each external id once, ever
        seen += (yield ("row", _SUBMISSION, (*row, t))) is None
    if seen:  # one seen before undoes the whole step
        raise _duplicates(writes, seen)
    if writes.entries:
        counts, heads = reservations(writes.entries)
        next_seq: dict[int, int] = {}
        for conversation_id in sorted(counts):  # one lock order for every writer
            n = counts[conversation_id]
            last = yield ("value", _SEQ, (conversation_id, n, t, heads.get(conversation_id)))
            if last is None:  # as SQLAlchemy's scalar_one() would have it
                raise LookupError(f"no conversation id {conversation_id}")
            next_seq[conversation_id] = last - n + 1
        rows = []
        for conversation_id, *rest in _entry_rows(writes, t):
            seq = next_seq[conversation_id]
            next_seq[conversation_id] = seq + 1
            rows.append((conversation_id, seq, *rest))
            result.entry_seqs.append(seq)
        yield ("many", _ENTRY, rows)
    if writes.tasks:
        rows = _task_rows(writes, t)
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
        yield ("many", _USAGE, [(*row, t) for row in _usage_rows(writes)])
    if (u := writes.task_update) is not None:
        yield from _update(u, t, parent, _wakes_self(u, writes))
    for sleeper in writes.wakes:  # after our own row, as in commit.apply
        yield ("run", _WAKE_SLEEPER, (sleeper, t))
    return result


def _update(u: TaskUpdate, t: float, parent: str | None, wake_self: bool):
    """The fenced update of a task, then the wake it owes: its own (a wait whose children
    all settled already) or its parent's (the last child to settle)."""
    params = update_params(u, t)
    if parent == "?" and u.state in TERMINAL:
        row = yield ("row", UPDATE_SQL, params)
        if row is None:
            raise LeaseLost(u.task_id, u.owner)
        parent = row[0]
    elif (yield ("count", UPDATE_KNOWN_PARENT, params)) != 1:
        raise LeaseLost(u.task_id, u.owner)
    if u.state == PENDING and u.wake_if_settled:  # one writer: no lock needed first
        yield ("run", _WAKE_IF_SETTLED, (u.task_id, json_text(list(u.wake_if_settled))))
    if wake_self:
        yield ("run", WAKE_SQLITE, (u.task_id, t))
    elif u.state in TERMINAL and parent is not None:
        yield ("run", WAKE_SQLITE, (parent, t))  # one writer: no lock needed


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


# -- PostgreSQL: one call of steward_step --------------------------------------------------

_CALL = "SELECT * FROM steward_step(" + ", ".join(f"${i}" for i in range(1, 66)) + ")"
_NO_UPDATE = (None,) * 19


def _columns(rows: list[tuple], width: int) -> tuple:
    """Rows as the function takes them: one array per column, or NULL each for none."""
    return tuple(zip(*rows, strict=True)) if rows else (None,) * width


def call_args(writes: Writes, t: float, parent: str | None = "?",
              claim: Claim | None = None) -> tuple:
    """`steward_step`'s arguments for a step that `fits` (see `plan` for `parent`), and
    the claim to make after it, if any."""
    entries, at, offsets, conversation_ids = [], [], [], []
    if writes.entries:
        counts, heads = reservations(writes.entries)
        conversation_ids = sorted(counts)  # the order the function takes their positions
        index = {c: i for i, c in enumerate(conversation_ids, 1)}
        taken = dict.fromkeys(conversation_ids, 0)
        for conversation_id, *rest in _entry_rows(writes, t):
            at.append(index[conversation_id])
            offsets.append(taken[conversation_id])
            taken[conversation_id] += 1
            entries.append(rest)
        reserved = (conversation_ids, [counts[c] for c in conversation_ids],
                    [heads.get(c) for c in conversation_ids])
        entry_columns = (at, offsets, *zip(*entries, strict=True))
    else:
        reserved, entry_columns = (None,) * 3, (None,) * 9
    if (u := writes.task_update) is not None:
        p = update_params(u, t)  # ?1 ... ?15 of UPDATE_SQL; ?10 is now, passed first
        update = (*p[:9], *p[10:15], parent != "?", None if parent == "?" else parent,
                  _wakes_self(u, writes), u.state in TERMINAL,
                  list(u.wake_if_settled) if u.state == PENDING and u.wake_if_settled
                  else None)
    else:
        update = _NO_UPDATE
    return (t, *_columns(_submission_rows(writes), 7), *reserved, *entry_columns,
            *_columns(_task_rows(writes, t), 8), *_columns(_usage_rows(writes), 11),
            *update, list(writes.wakes) or None,
            *_claim_args(claim, t))


def _claim_args(claim: Claim | None, t: float) -> tuple:
    """`claim_params` without the clock (the function has it already)."""
    if claim is None:
        return (None,) * 6
    owner, expires, _, *rest = claim_params(claim, t, list(claim.intent_kinds))
    return owner, expires, *rest


async def on_postgres(conn, writes: Writes, t: float, parent: str | None = "?",
                      claim: Claim | None = None, block=None) -> CommitResult:
    """One step that `fits`, and `claim` after it, as one autocommitted call on an asyncpg
    connection. `block(task_id, reason)`: for a claimed row that cannot be read."""
    import asyncpg

    try:
        rows = await conn.fetch(_CALL, *call_args(writes, t, parent, claim))
    except asyncpg.PostgresError as exc:
        if exc.sqlstate == "SW001":
            raise DuplicateSubmission(exc.args[0] if exc.args else "seen before") from None
        if exc.sqlstate == "SW002":
            raise LeaseLost(writes.task_update.task_id, writes.task_update.owner) from None
        if exc.sqlstate == "SW003":
            raise LookupError(exc.args[0] if exc.args else "no conversation") from None
        raise
    deduped = iter(rows[0]["deduped_ids"] or ())
    result = CommitResult(task_ids=[nt.id if nt.dedupe_key is None else next(deduped)
                                    for nt in writes.tasks])
    if writes.entries:
        counts, _ = reservations(writes.entries)
        next_seq = dict(zip(sorted(counts), rows[0]["seq_bases"], strict=True))
        for e in writes.entries:
            result.entry_seqs.append(next_seq[e.conversation_id])
            next_seq[e.conversation_id] += 1
    if claim is not None:
        result.claimed = claimed_tasks(
            [r["claimed_task"] for r in rows if r["claimed_task"] is not None], block)
    return result
