"""The task queue's hot path as fixed statements, run straight on the driver.

A claim, a phase commit and a result are most of what the store ever does, and building
them with SQLAlchemy on every call cost several times what the database spends running
them. Here each is one statement written once per dialect; the driver prepares it once and
keeps it (sqlite3's statement cache, asyncpg's prepared statements). Everything else a step
writes still goes through `store/commit.py`.

Claims read only the rows they take (migration 0010): expired leases along
`ix_tasks_leases`, then due work along `ix_tasks_ready` in (run_after, id) order. A claim
may carry the intents of the unsafe effects it takes (`writes.Claim`), and on SQLite it may
share the transaction of the result that frees its slot (`Store.commit(then_claim=)`).
"""

import json
import logging
import re
from functools import lru_cache

from store.errors import CorruptRow, LeaseLost
from store.records import (
    BLOCKED,
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    TERMINAL,
    WAITING,
    Task,
    dumps,
    now,
    task_from_mapping,
)
from store.schema import storable
from store.writes import Claim, TaskUpdate, Writes

log = logging.getLogger(__name__)

_TERMINAL = ", ".join(f"'{s}'" for s in sorted(TERMINAL))

# ?1 owner, ?2 lease expiry, ?3 now, ?4 limit. A lease taken over counts a death.
_SET_CLAIMED = f"""
    state = '{RUNNING}', lease_owner = ?1, lease_expires = ?2, updated_at = ?3,
    crashes = CASE WHEN state = '{RUNNING}' THEN crashes + 1 ELSE crashes END,
    crashed_since = CASE WHEN state = '{RUNNING}' THEN coalesce(crashed_since, ?3)
                         ELSE crashed_since END"""
# Never the claimer's own: a renewal that came late leaves the task running here, in memory.
_EXPIRED = (f"SELECT id FROM tasks WHERE state = '{RUNNING}' AND lease_expires < ?3 "
            "AND lease_owner <> ?1 ORDER BY lease_expires LIMIT ?4")
_DUE = (f"SELECT id FROM tasks WHERE state = '{PENDING}' AND run_after <= ?3 "
        "ORDER BY run_after, id LIMIT ?4")

# ?5 the kinds whose intent rides on the claim, ?6 its checkpoint, ?7 `Claim.ride_below`.
# Conditions on the row as it was (an UPDATE's SET reads the old values).
_RIDES = ("phase = '' AND checkpoint IS NULL AND {kinds} "
          f"AND crashes + CASE WHEN state = '{RUNNING}' THEN 1 ELSE 0 END < ?7")
_SET_RIDES = """,
    phase = CASE WHEN {rides} THEN 'effect' ELSE phase END,
    checkpoint = CASE WHEN {rides} THEN ?6 ELSE checkpoint END"""
# On SQLite ?5 is the kinds between unit separators (`_kinds_param`): `IN (SELECT value FROM
# json_each(?5))` built a temporary index per use, a fifth of a claim's cost.
_RIDES_SQLITE = _RIDES.format(kinds="instr(?5, char(31) || kind || char(31)) > 0")
_RIDES_SQLITE_JSON = _RIDES.format(kinds="kind IN (SELECT value FROM json_each(?5))")
_RIDES_PG = _RIDES.format(kinds="kind = ANY(?5::text[])")

_CLAIM_SQLITE = """
UPDATE tasks SET {set}
WHERE id IN (SELECT id FROM ({expired}) UNION ALL SELECT id FROM ({due}) LIMIT ?4)
RETURNING *"""
CLAIM_SQLITE = _CLAIM_SQLITE.format(set=_SET_CLAIMED + _SET_RIDES.format(rides=_RIDES_SQLITE),
                                    expired=_EXPIRED, due=_DUE)
# A kind with a unit separator in its name (none is) is matched through JSON instead.
_CLAIM_SQLITE_JSON = _CLAIM_SQLITE.format(
    set=_SET_CLAIMED + _SET_RIDES.format(rides=_RIDES_SQLITE_JSON), expired=_EXPIRED,
    due=_DUE)

# The same on PostgreSQL: rows another worker is claiming are skipped, not waited for, and
# the ids picked are joined to the primary key (a nested loop: both sides are estimated
# at their LIMIT). Handed over as an array (`id = ANY(ARRAY(...))`) they were matched by a
# sequential scan of the whole table while it was small enough for the planner's guess of
# ten ids to favour one: 0.5 ms of a 1 ms step at 4,000 tasks.
_PICKED = "(SELECT id FROM expired UNION ALL SELECT id FROM due LIMIT {limit}) AS picked"
CLAIM_PG_WITH = (f"expired AS ({_EXPIRED} FOR UPDATE SKIP LOCKED), "
                 f"due AS ({_DUE} FOR UPDATE SKIP LOCKED)")
CLAIM_PG_UPDATE = f"""UPDATE tasks SET {_SET_CLAIMED}{_SET_RIDES.format(rides=_RIDES_PG)}
FROM {_PICKED.format(limit="?4")}
WHERE tasks.id = picked.id
RETURNING tasks.*"""
CLAIM_PG = f"\nWITH {CLAIM_PG_WITH}\n{CLAIM_PG_UPDATE}"

# ?1 id, ?2 owner, ?3 state, ?4 phase, ?5 checkpoint, ?6 result, ?7 error, ?8 wait mode,
# ?9 run_after, ?10 now, ?11 keep the lease, ?12 attempts (NULL: as they are),
# ?13 progressed (deaths forgotten), ?14 inputs (NULL: as they are), ?15 the error's kind,
# ?16 'running'. Fenced by the lease. The state it must be in is a bound parameter: written
# in, it is ix_tasks_leases' own condition, and PostgreSQL took that small index for the
# row, reading every entry of it (the dead ones too), where the primary key finds one.
UPDATE_SQL = """
UPDATE tasks SET state = ?3, phase = ?4, checkpoint = ?5, result = ?6, error = ?7,
    wait_mode = ?8, run_after = ?9, updated_at = ?10,
    lease_owner = CASE WHEN ?11 THEN lease_owner END,
    lease_expires = CASE WHEN ?11 THEN lease_expires END,
    attempts = coalesce(?12, attempts),
    crashes = CASE WHEN ?13 THEN 0 ELSE crashes END,
    crashed_since = CASE WHEN ?13 THEN NULL ELSE crashed_since END,
    inputs = coalesce(?14, inputs), failure = ?15
WHERE id = ?1 AND lease_owner = ?2 AND state = ?16
RETURNING parent_id"""
# The same when the task's parent is known (`Store` remembers those of the tasks it
# claimed): RETURNING costs SQLite a temporary table per statement.
UPDATE_KNOWN_PARENT = UPDATE_SQL.replace("\nRETURNING parent_id", "")

# A lone update and the claim of what takes its slot, as one statement on PostgreSQL: the
# update's parameters, then the claim's shifted past them (?17 owner ... ?23). Nothing is
# claimed unless the update landed, and never the task being updated.
def _after(sql: str, by: int) -> str:
    return re.sub(r"\?(\d+)", lambda m: f"?{int(m.group(1)) + by}", sql)


_NOT_IT = " AND id <> ?1"
UPDATE_THEN_CLAIM_PG = f"""
WITH finished AS ({UPDATE_SQL}),
expired AS ({_after(_EXPIRED, 16).replace(" ORDER BY", _NOT_IT + " ORDER BY")}
            FOR UPDATE SKIP LOCKED),
due AS ({_after(_DUE, 16).replace(" ORDER BY", _NOT_IT + " ORDER BY")} FOR UPDATE SKIP LOCKED),
claimed AS (
    UPDATE tasks SET {_after(_SET_CLAIMED + _SET_RIDES.format(rides=_RIDES_PG), 16)}
    FROM {_PICKED.format(limit="?20")}
    WHERE tasks.id = picked.id AND EXISTS (SELECT 1 FROM finished)
    RETURNING tasks.*)
SELECT (SELECT count(*) FROM finished) AS finished, claimed.*
FROM (SELECT 1) AS one LEFT JOIN claimed ON true"""

# A waiting task pending again when its wait is over (every child settled, or one failed
# under fail_fast): ?1 the waiting task, ?2 now. Every path runs it (store/steps.py).
WAKE_WAITING = f"""
UPDATE tasks SET state = '{PENDING}', run_after = 0.0, updated_at = ?2
WHERE id = ?1 AND state = '{WAITING}' AND (
    NOT EXISTS (SELECT 1 FROM tasks c WHERE c.parent_id = ?1 AND c.state NOT IN ({_TERMINAL}))
    OR (wait_mode = 'fail_fast'
        AND EXISTS (SELECT 1 FROM tasks c WHERE c.parent_id = ?1 AND c.state = '{FAILED}')))"""

BLOCK_SQL = (f"UPDATE tasks SET state = '{BLOCKED}', error = ?2, lease_owner = NULL, "
             "lease_expires = NULL, updated_at = ?3 WHERE id = ?1")


def pg(sql: str) -> str:
    """asyncpg numbers its parameters $1, $2 ... where SQLite takes ?1, ?2 ..."""
    return sql.replace("?", "$")


def lone_update(writes: Writes) -> TaskUpdate | None:
    """The task update, when it is all a step writes (most phases of most tasks) and
    needs no check against other tasks first."""
    u = writes.task_update
    if u is None or u.wake_if_settled or writes.wakes or writes.entries or writes.tasks \
            or writes.submissions or writes.documents or writes.usage or writes.schedules \
            or writes.withdrawals:
        return None
    return u


# `records.dumps` without building an encoder per call (every step encodes three values).
_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


def json_text(value):
    return None if value is None else storable(_encode(value))


_SEP = "\x1f"


@lru_cache(maxsize=64)
def _kinds_param(kinds: tuple[str, ...]) -> tuple[str, str]:
    """A claim's intent kinds as SQLite's claim reads them, and that claim (the same few
    tuples every time): each kind between unit separators, or "" for none."""
    if any(_SEP in k for k in kinds):
        return _CLAIM_SQLITE_JSON, dumps(list(kinds))
    return CLAIM_SQLITE, (_SEP + _SEP.join(kinds) + _SEP) if kinds else ""


def _ride(c: Claim) -> str:
    """`Claim.ride`, encoded here."""
    return _encode({"claim": c.claim_id})


def update_params(u: TaskUpdate, t: float) -> tuple:
    return (storable(u.task_id), storable(u.owner), u.state, storable(u.phase),
            json_text(u.checkpoint), json_text(u.result),
            None if u.error is None else storable(u.error), u.wait_mode, float(u.run_after),
            t, u.state == RUNNING, u.attempts, u.progressed, json_text(u.inputs), u.failure,
            RUNNING)


def claimed_tasks(rows, block) -> list[Task]:
    """Decode claimed rows (mappings); an undecodable one is handed to `block(id, reason)`
    and left out, so it cannot stop the queue."""
    claimed = []
    for row in rows:
        try:
            claimed.append(task_from_mapping(row))
        except CorruptRow as exc:
            log.error("blocking task %s: %s", row["id"], exc)
            block(row["id"], str(exc))
    claimed.sort(key=lambda task: task.id)
    return claimed


# -- SQLite: blocking calls, made on the writer thread inside its transaction -------------


def claim_params(c: Claim, t: float, kinds) -> tuple:
    return (storable(c.owner), t + c.lease_seconds, t, c.limit, kinds, _ride(c), c.ride_below)


def sqlite_claim(raw, c: Claim, t: float) -> list[Task]:
    sql, kinds = _kinds_param(tuple(c.intent_kinds))
    cur = raw.execute(sql, claim_params(c, t, kinds))
    rows = cur.fetchall()
    if not rows:
        return []
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r, strict=True)) for r in rows]
    return claimed_tasks(rows, lambda task_id, reason: raw.execute(
        BLOCK_SQL, (task_id, reason, t)))


# -- PostgreSQL: one autocommitted statement, one round trip -----------------------------

CLAIM_ASYNCPG = pg(CLAIM_PG)
UPDATE_THEN_CLAIM_ASYNCPG = pg(UPDATE_THEN_CLAIM_PG)
UPDATE_ASYNCPG = pg(UPDATE_SQL)
BLOCK_ASYNCPG = pg(BLOCK_SQL)


def pg_fits(u: TaskUpdate, parent_known_none: bool) -> bool:
    """Whether the update is the whole transaction on PostgreSQL: no wait to check, and no
    parent to wake (a settling child locks its parent first, in a transaction of its own:
    `steps.wake_parent`)."""
    if u.state == WAITING:
        return False
    return u.state not in TERMINAL or parent_known_none


async def pg_claim(conn, c: Claim, t: float) -> list[Task]:
    rows = await conn.fetch(CLAIM_ASYNCPG, *claim_params(c, t, list(c.intent_kinds)))
    blocked = []
    claimed = claimed_tasks(rows, lambda task_id, reason: blocked.append((task_id, reason)))
    for task_id, reason in blocked:
        await conn.execute(BLOCK_ASYNCPG, task_id, reason, t)
    return claimed


async def pg_update(conn, u: TaskUpdate, t: float) -> None:
    if await conn.fetchrow(UPDATE_ASYNCPG, *update_params(u, t)) is None:
        raise LeaseLost(u.task_id, u.owner)


async def pg_update_then_claim(conn, u: TaskUpdate, c: Claim, t: float) -> list[Task]:
    rows = await conn.fetch(UPDATE_THEN_CLAIM_ASYNCPG, *update_params(u, t),
                            *claim_params(c, t, list(c.intent_kinds)))
    if not rows[0]["finished"]:
        raise LeaseLost(u.task_id, u.owner)
    blocked = []
    claimed = claimed_tasks([r for r in rows if r["id"] is not None],
                            lambda task_id, reason: blocked.append((task_id, reason)))
    for task_id, reason in blocked:
        await conn.execute(BLOCK_ASYNCPG, task_id, reason, t)
    return claimed


async def explain_claim(engines, limit: int = 8, *, after_update: bool = False) -> str:
    """The database's plan for a claim (diagnostics, and the test that checks a claim
    reads only the rows it takes). `after_update`: PostgreSQL's statement that updates a
    task and claims what takes its slot. On PostgreSQL it is the generic plan the hot
    path's connections run (`HotPool`), whatever the values."""
    t = now()
    c = Claim("explain", limit, 0.0)
    args = claim_params(c, t, "" if engines.dialect == "sqlite" else [])
    if engines.dialect == "sqlite":
        async with engines.read.connect() as conn:
            rows = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {CLAIM_SQLITE}",
                                               args)).all()
        return "\n".join(str(r[-1]) for r in rows)
    if after_update:
        u = TaskUpdate("explain", "explain", DONE, "")
        sql, args = UPDATE_THEN_CLAIM_ASYNCPG, (*update_params(u, t), *args)
    else:
        sql = CLAIM_ASYNCPG
    async with (await engines.pool()).acquire() as conn:
        await conn.execute(f"PREPARE steward_explain AS {sql}")
        try:
            rows = await conn.fetch(
                f"EXPLAIN EXECUTE steward_explain({', '.join(['NULL'] * len(args))})")
        finally:
            await conn.execute("DEALLOCATE steward_explain")
    return "\n".join(r[0] for r in rows)
