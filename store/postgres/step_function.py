"""`steward_step`: a step of the common shape as one call on PostgreSQL, generated.

Sent from the client as separate statements inside a transaction, such a step was six or
seven round trips (BEGIN, the conversation's positions, the entries, the tasks, the
update, its wake, COMMIT). This function runs the same statements in the same order as
SQLite's plan (`store/steps.py`) on the server: one autocommitted statement, and then, if
asked, the claim of what takes the step's slot. Its text is rendered here from the
statements themselves (store/step_sql.py, store/hotpath.py), never written twice; a
migration (re)creates it with `create_statements()`, and `DIGEST` tells the tests when the
text changed and a migration is owed.

Every argument is an array (one element per row) or a scalar; NULL for "none". It returns
each conversation's first new position (`seq_bases`) and the ids the spawns with a dedupe
key found or made (`deduped_ids`), beside each task claimed, or beside NULL when none was.
What cannot be done undoes the whole call and says why by SQLSTATE: SW001 an external id
seen before, SW002 the task's lease is gone, SW003 no such conversation.
"""

import hashlib

from store import hotpath
from store.errors import LeaseLost
from store.hotpath import claim_params, claimed_tasks, update_params
from store.records import PENDING, TERMINAL, CommitResult
from store.step_sql import (
    ENTRIES,
    SEQ,
    SUBMISSIONS,
    TASKS,
    USAGE,
    WAKE_IF_SETTLED,
    WAKE_SLEEPERS,
    Insert,
    bind,
)
from store.steps import (
    DuplicateSubmission,
    entry_rows,
    reservations,
    submission_rows,
    task_rows,
    usage_rows,
    wakes_self,
)
from store.writes import Claim, Writes

NAME = "steward_step"

# The task update's arguments: UPDATE_SQL's ?1 ... ?16 (?10 the clock, ?16 the state it
# must be in, a variable), then what the function needs to know beside them.
_UPDATE_ARGS = [("u_id", "text"), ("u_owner", "text"), ("u_state", "text"),
                ("u_phase", "text"), ("u_checkpoint", "text"), ("u_result", "text"),
                ("u_error", "text"), ("u_wait_mode", "text"), ("u_run_after", "float8"),
                ("u_keep_lease", "bool"), ("u_attempts", "int"), ("u_progressed", "bool"),
                ("u_inputs", "text"), ("u_failure", "text"), ("u_parent_known", "bool"),
                ("u_parent", "text"), ("u_wake_self", "bool"), ("u_settles", "bool"),
                ("u_wake_if_settled", "text[]")]
_UPDATE_BIND = [n for n, _ in _UPDATE_ARGS[:9]] + ["p_now"] + \
    [n for n, _ in _UPDATE_ARGS[9:14]] + ["running"]
# The claim's: claim_params without the clock (p_now).
_CLAIM_ARGS = [("c_owner", "text"), ("c_expires", "float8"), ("c_limit", "int"),
               ("c_kinds", "text[]"), ("c_ride", "text"), ("c_ride_below", "int")]
_CLAIM_BIND = ["c_owner", "c_expires", "p_now", "c_limit", "c_kinds", "c_ride",
               "c_ride_below"]


def _arrays(ins: Insert, extra: tuple[tuple[str, str], ...] = ()) -> list[tuple[str, str]]:
    return [(f"{ins.prefix}_{c.name}", f"{c.pg}[]") for c in ins.cols] + \
        [(f"{ins.prefix}_{n}", f"{t}[]") for n, t in extra]


_TASK_DEDUPE = (("dedupe_key", "text"),)
ARGS: list[tuple[str, str]] = [
    ("p_now", "float8"),
    *_arrays(SUBMISSIONS),
    ("r_conv", "bigint[]"), ("r_count", "bigint[]"), ("r_head", "bigint[]"),
    ("e_at", "int[]"), ("e_offset", "bigint[]"),  # each entry's conversation and place
    *_arrays(ENTRIES),
    *_arrays(TASKS, _TASK_DEDUPE),
    *_arrays(USAGE),
    *_UPDATE_ARGS,
    ("w_ids", "text[]"),
    *_CLAIM_ARGS,
]
SIGNATURE = f"{NAME}({', '.join(f'{n} {t}' for n, t in ARGS)})"


def _unnest(ins: Insert, lead: list[str] = (), lead_sql: list[str] = (),
            extra: tuple[tuple[str, str], ...] = (), where: str = "",
            tail: str = "") -> str:
    """INSERT ... SELECT over the argument arrays, in their order."""
    arrays = [n for n, _ in _arrays(ins, extra)]
    if lead:
        arrays = [f"{ins.prefix}_{n}" for n in lead] + arrays
    aliases = [f"c{i}" for i in range(1, len(arrays) + 1)]
    step = [f"x.{a}" for a in aliases[len(lead):len(lead) + len(ins.cols)]]
    fixed = [f[2] for f in ins.fixed]
    lead_values = [v.format(*(f"x.c{i}" for i in range(1, len(lead) + 1)))
                   for v in lead_sql]
    columns = [*(["conversation_id", "seq"] if lead else []), *ins.names]
    return (f"INSERT INTO {ins.table} ({', '.join(columns)})\n"
            f"        SELECT {', '.join([*lead_values, *step, *fixed])}\n"
            f"        FROM unnest({', '.join(arrays)})\n"
            f"             WITH ORDINALITY AS x({', '.join(aliases)}, n)\n"
            f"        {where}ORDER BY x.n{tail};")


def _body() -> str:
    sub = _unnest(SUBMISSIONS, tail="\n        ON CONFLICT (channel, external_id) DO NOTHING")
    entries = _unnest(ENTRIES, lead=["at", "offset"],
                      lead_sql=["r_conv[{0}]", "bases[{0}] + {1}"])
    dedupe = len(TASKS.cols) + 1
    tasks = _unnest(TASKS, extra=_TASK_DEDUPE, where=f"WHERE x.c{dedupe} IS NULL\n        ")
    task_args = [f"{TASKS.prefix}_{c.name}[i]" for c in TASKS.cols]
    deduped_insert = (
        f"INSERT INTO tasks ({', '.join([*TASKS.names, 'dedupe_key'])})\n"
        f"            VALUES ({', '.join([*task_args, *(f[2] for f in TASKS.fixed)])}, "
        f"t_dedupe_key[i])\n"
        "            ON CONFLICT (dedupe_key) DO NOTHING;")
    usage = _unnest(USAGE)
    seq = bind(SEQ, ["r_conv[i]", "r_count[i]", "p_now", "r_head[i]"]) + " INTO last"
    update = bind(hotpath.UPDATE_SQL.strip(), _UPDATE_BIND) + " INTO par"
    wake = " ".join(hotpath.WAKE_WAITING.split())

    def wake_of(who: str) -> str:
        return bind(wake, [who, "p_now"]) + ";"

    settled = bind(WAKE_IF_SETTLED.format(those="= ANY(u_wake_if_settled)"), ["u_id"])
    sleepers = bind(WAKE_SLEEPERS.format(ids="= ANY(w_ids)"), ["", "p_now", "pending"])
    claim = bind(f"WITH {hotpath.CLAIM_PG_WITH},\nclaimed AS ({hotpath.CLAIM_PG_UPDATE})\n"
                 "SELECT bases, deduped, claimed::tasks FROM claimed;", _CLAIM_BIND)
    return f"""
DECLARE
    bases bigint[] := '{{}}';  -- each conversation's first new position
    deduped text[] := '{{}}';  -- the ids of the spawns with a dedupe key, in order
    last bigint;
    landed bigint;
    par text;
    -- The states the statements naming tasks by id require, as variables (parameters of
    -- the plan): written in, they are ix_tasks_leases' and ix_tasks_ready's conditions,
    -- and the planner took those indexes for the rows (every entry read, the dead ones
    -- too) where the key finds them.
    running text := 'running';
    pending text := 'pending';
BEGIN
    IF s_channel IS NOT NULL THEN
        {sub}
        GET DIAGNOSTICS landed = ROW_COUNT;
        IF landed < cardinality(s_channel) THEN
            RAISE EXCEPTION '% of %''s ids seen before', cardinality(s_channel) - landed,
                s_channel[1] USING ERRCODE = 'SW001';
        END IF;
    END IF;

    IF r_conv IS NOT NULL THEN
        FOR i IN 1 .. cardinality(r_conv) LOOP  -- in id order: one lock order for all
            {seq};
            IF NOT FOUND THEN
                RAISE EXCEPTION 'no conversation id %', r_conv[i] USING ERRCODE = 'SW003';
            END IF;
            bases := bases || (last - r_count[i] + 1);
        END LOOP;
        {entries}
    END IF;

    IF t_id IS NOT NULL THEN
        {tasks}
        -- A spawn with a dedupe key (a delivery) is nothing if the key is there already;
        -- the id of whichever task holds it is the spawn's.
        FOR i IN 1 .. cardinality(t_id) LOOP
            CONTINUE WHEN t_dedupe_key[i] IS NULL;
            {deduped_insert}
            deduped := deduped || (SELECT id FROM tasks WHERE dedupe_key = t_dedupe_key[i]);
        END LOOP;
    END IF;

    IF g_task_id IS NOT NULL THEN
        {usage}
    END IF;

    IF u_id IS NOT NULL THEN  -- fenced by the lease
        IF u_wake_if_settled IS NOT NULL THEN
            -- A sleeper that waits for other tasks locks them before its own row, the
            -- order a settling task takes (its row, then ours): the check below then sees
            -- one settled, or its wake finds us pending.
            PERFORM 1 FROM tasks WHERE id = ANY(u_wake_if_settled) ORDER BY id FOR SHARE;
        END IF;
        {update};
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % is no longer leased to %', u_id, u_owner
                USING ERRCODE = 'SW002';
        END IF;
        IF u_parent_known THEN
            par := u_parent;
        END IF;
        IF u_wake_if_settled IS NOT NULL THEN  -- due at once if one settled already
            {settled};
        END IF;
        IF u_wake_self THEN
            {wake_of("u_id")}
        ELSIF u_settles AND par IS NOT NULL THEN
            -- Locked before the look at its children: two children settling together
            -- would each see the other running.
            PERFORM 1 FROM tasks WHERE id = par FOR UPDATE;
            {wake_of("par")}
        END IF;
    END IF;

    IF w_ids IS NOT NULL THEN  -- sleepers woken early, after our own row
        {sleepers};
    END IF;
    seq_bases := bases;
    deduped_ids := deduped;
    IF c_owner IS NOT NULL THEN  -- the claim that takes the freed slot
        RETURN QUERY
        {claim}
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    claimed_task := NULL;
    RETURN NEXT;
END"""


BODY = _body()
CREATE = (f"CREATE OR REPLACE FUNCTION {SIGNATURE} RETURNS TABLE ("
          "seq_bases bigint[], deduped_ids text[], claimed_task tasks) "
          f"LANGUAGE plpgsql AS $step${BODY}$step$")
DIGEST = hashlib.sha256(CREATE.encode()).hexdigest()[:16]
CALL = f"SELECT * FROM {NAME}(" + ", ".join(f"${i}" for i in range(1, len(ARGS) + 1)) + ")"

# Every function of the name in the store's schema, whatever its arguments: a migration
# drops them all before it creates this one (an early 0015 left one behind).
DROP_ALL = f"""
DO $drop$
DECLARE f regprocedure;
BEGIN
    FOR f IN SELECT oid::regprocedure FROM pg_proc
             WHERE proname = '{NAME}' AND pronamespace = current_schema()::regnamespace
    LOOP
        EXECUTE 'DROP FUNCTION ' || f::text;
    END LOOP;
END $drop$"""


def create_statements() -> list[str]:
    """What a migration runs to (re)create the function as this build states it."""
    return [DROP_ALL, CREATE]


# -- the call -----------------------------------------------------------------------------

_NO_UPDATE = (None,) * len(_UPDATE_ARGS)


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
        for conversation_id, *rest in entry_rows(writes, t):
            at.append(index[conversation_id])
            offsets.append(taken[conversation_id])
            taken[conversation_id] += 1
            entries.append(rest)
        reserved = (conversation_ids, [counts[c] for c in conversation_ids],
                    [heads.get(c) for c in conversation_ids])
        entry_columns = (at, offsets, *zip(*entries, strict=True))
    else:
        reserved, entry_columns = (None,) * 3, (None,) * (2 + len(ENTRIES.cols))
    if (u := writes.task_update) is not None:
        p = update_params(u, t)  # ?1 ... ?15 of UPDATE_SQL; ?10 is now, passed first
        update = (*p[:9], *p[10:15], parent != "?", None if parent == "?" else parent,
                  wakes_self(u, writes), u.state in TERMINAL,
                  list(u.wake_if_settled) if u.state == PENDING and u.wake_if_settled
                  else None)
    else:
        update = _NO_UPDATE
    return (t, *_columns(submission_rows(writes), len(SUBMISSIONS.cols)), *reserved,
            *entry_columns, *_columns(task_rows(writes, t), len(TASKS.cols) + 1),
            *_columns(usage_rows(writes), len(USAGE.cols)),
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
        rows = await conn.fetch(CALL, *call_args(writes, t, parent, claim))
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
