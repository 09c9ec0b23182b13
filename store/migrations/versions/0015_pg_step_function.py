"""A step of the common shape as one call on PostgreSQL: `steward_step(...)`.

Sent from the client as separate statements inside a transaction, such a step (an entry,
a spawned child or a delivery, the task's update) was six or seven round trips: BEGIN, the
conversation's positions, the entries, the tasks, the update, its wake, COMMIT. This
function does the same statements, in the same order (`store/steps.py` `plan`), on the
server: one autocommitted statement, one round trip; and then, if asked, the claim of what
takes the step's slot (`store/hotpath.py` CLAIM_PG), which was a round trip of its own
after the commit. Each statement inside sees what the ones before it wrote, and under
READ COMMITTED a fresh snapshot, as when the client sent them (a settling child locks its
parent before it looks at the parent's other children).

Every argument is an array (one element per row) or a scalar; NULL for "none". It returns
each conversation's first new position (`seq_bases`) and the ids the spawns with a dedupe
key found or made (`deduped_ids`), beside each task claimed, or beside NULL when none was.
What cannot be done undoes the whole call and says why by SQLSTATE: SW001 an external id
seen before, SW002 the task's lease is gone, SW003 no such conversation.

SQLite has no functions of this kind and needs none: its steps run on the writer's own
connection, with no round trips. The function lives in the store's schema.

Revision ID: 0015
Revises: 0014
"""

from alembic import op
from sqlalchemy import text

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

_SIGNATURE = """steward_step(
    p_now float8,
    s_channel text[], s_external text[], s_conv bigint[], s_task text[], s_state text[],
    s_reason text[], s_payload text[],
    r_conv bigint[], r_count bigint[], r_head bigint[],
    e_at int[], e_offset bigint[], e_kind text[], e_author text[], e_text text[],
    e_data text[], e_ref text[], e_task text[], e_created float8[],
    t_id text[], t_kind text[], t_parent text[], t_conv bigint[], t_inputs text[],
    t_idem text[], t_run_after float8[], t_dedupe text[],
    g_task text[], g_conv bigint[], g_provider text[], g_model text[], g_in int[],
    g_out int[], g_cache_read int[], g_cache_write int[], g_cost float8[], g_ok bool[],
    g_error text[],
    u_id text, u_owner text, u_state text, u_phase text, u_checkpoint text, u_result text,
    u_error text, u_wait_mode text, u_run_after float8, u_keep_lease bool, u_attempts int,
    u_progressed bool, u_inputs text, u_failure text,
    u_parent_known bool, u_parent text, u_wake_self bool, u_settles bool,
    u_wake_if_settled text[],
    w_ids text[],
    c_owner text, c_expires float8, c_limit int, c_kinds text[], c_ride text,
    c_ride_below int)"""

# The wake of a waiting task whose wait is over (`store/hotpath.py` WAKE_SQLITE).
_WAKE = """
        UPDATE tasks SET state = 'pending', run_after = 0.0, updated_at = p_now
        WHERE id = {id} AND state = 'waiting' AND (
            NOT EXISTS (SELECT 1 FROM tasks c WHERE c.parent_id = {id}
                        AND c.state NOT IN ('done', 'failed', 'interrupted'))
            OR (wait_mode = 'fail_fast' AND EXISTS (
                SELECT 1 FROM tasks c WHERE c.parent_id = {id} AND c.state = 'failed')));"""

# A claimed task's intent rides on its claim (`store/writes.py` Claim): conditions on the
# row as it was.
_RIDES = ("(phase = '' AND checkpoint IS NULL AND kind = ANY(c_kinds) "
          "AND crashes + CASE WHEN state = 'running' THEN 1 ELSE 0 END < c_ride_below)")

_BODY = f"""
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
        INSERT INTO submissions (channel, external_id, conversation_id, task_id, state,
                                 reason, payload, created_at)
        SELECT x.channel, x.external, x.conv, x.task, x.state, x.reason, x.payload, p_now
        FROM unnest(s_channel, s_external, s_conv, s_task, s_state, s_reason, s_payload)
             WITH ORDINALITY AS x(channel, external, conv, task, state, reason, payload, n)
        ORDER BY x.n
        ON CONFLICT (channel, external_id) DO NOTHING;
        GET DIAGNOSTICS landed = ROW_COUNT;
        IF landed < cardinality(s_channel) THEN
            RAISE EXCEPTION '% of %''s ids seen before', cardinality(s_channel) - landed,
                s_channel[1] USING ERRCODE = 'SW001';
        END IF;
    END IF;

    IF r_conv IS NOT NULL THEN
        FOR i IN 1 .. cardinality(r_conv) LOOP  -- in id order: one lock order for all
            UPDATE conversations SET last_seq = last_seq + r_count[i], updated_at = p_now,
                head_seq = CASE WHEN r_head[i] IS NULL THEN head_seq
                                ELSE last_seq + 1 + r_head[i] END
            WHERE id = r_conv[i] RETURNING last_seq INTO last;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'no conversation id %', r_conv[i] USING ERRCODE = 'SW003';
            END IF;
            bases := bases || (last - r_count[i] + 1);
        END LOOP;
        INSERT INTO entries (conversation_id, seq, kind, author, text, data, ref, task_id,
                             created_at)
        SELECT r_conv[x.at], bases[x.at] + x.off, x.kind, x.author, x.txt, x.data, x.ref,
               x.task, x.created
        FROM unnest(e_at, e_offset, e_kind, e_author, e_text, e_data, e_ref, e_task,
                    e_created)
             WITH ORDINALITY AS x(at, off, kind, author, txt, data, ref, task, created, n)
        ORDER BY x.n;
    END IF;

    IF t_id IS NOT NULL THEN
        INSERT INTO tasks (id, kind, parent_id, conversation_id, state, phase, inputs,
                           idem_key, attempts, crashes, run_after, created_at, updated_at)
        SELECT x.id, x.kind, x.parent, x.conv, 'pending', '', x.inputs, x.idem, 0, 0,
               x.run_after, p_now, p_now
        FROM unnest(t_id, t_kind, t_parent, t_conv, t_inputs, t_idem, t_run_after, t_dedupe)
             WITH ORDINALITY AS x(id, kind, parent, conv, inputs, idem, run_after, dedupe, n)
        WHERE x.dedupe IS NULL
        ORDER BY x.n;
        -- A spawn with a dedupe key (a delivery) is nothing if the key is there already;
        -- the id of whichever task holds it is the spawn's.
        FOR i IN 1 .. cardinality(t_id) LOOP
            CONTINUE WHEN t_dedupe[i] IS NULL;
            INSERT INTO tasks (id, kind, parent_id, conversation_id, state, phase, inputs,
                               idem_key, attempts, crashes, run_after, created_at,
                               updated_at, dedupe_key)
            VALUES (t_id[i], t_kind[i], t_parent[i], t_conv[i], 'pending', '', t_inputs[i],
                    t_idem[i], 0, 0, t_run_after[i], p_now, p_now, t_dedupe[i])
            ON CONFLICT (dedupe_key) DO NOTHING;
            deduped := deduped || (SELECT id FROM tasks WHERE dedupe_key = t_dedupe[i]);
        END LOOP;
    END IF;

    IF g_task IS NOT NULL THEN
        INSERT INTO usage (task_id, conversation_id, provider, model, input_tokens,
                           output_tokens, cache_read_tokens, cache_write_tokens, cost_usd,
                           ok, error, created_at)
        SELECT x.task, x.conv, x.provider, x.model, x.i, x.o, x.cr, x.cw, x.cost, x.ok,
               x.error, p_now
        FROM unnest(g_task, g_conv, g_provider, g_model, g_in, g_out, g_cache_read,
                    g_cache_write, g_cost, g_ok, g_error)
             WITH ORDINALITY AS x(task, conv, provider, model, i, o, cr, cw, cost, ok,
                                  error, n)
        ORDER BY x.n;
    END IF;

    IF u_id IS NOT NULL THEN  -- fenced by the lease
        IF u_wake_if_settled IS NOT NULL THEN
            -- A sleeper that waits for other tasks locks them before its own row, the
            -- order a settling task takes (its row, then ours): the check below then sees
            -- one settled, or its wake finds us pending.
            PERFORM 1 FROM tasks WHERE id = ANY(u_wake_if_settled) ORDER BY id FOR SHARE;
        END IF;
        UPDATE tasks SET state = u_state, phase = u_phase, checkpoint = u_checkpoint,
            result = u_result, error = u_error, wait_mode = u_wait_mode,
            run_after = u_run_after, updated_at = p_now,
            lease_owner = CASE WHEN u_keep_lease THEN lease_owner END,
            lease_expires = CASE WHEN u_keep_lease THEN lease_expires END,
            attempts = coalesce(u_attempts, attempts),
            crashes = CASE WHEN u_progressed THEN 0 ELSE crashes END,
            crashed_since = CASE WHEN u_progressed THEN NULL ELSE crashed_since END,
            inputs = coalesce(u_inputs, inputs), failure = u_failure
        WHERE id = u_id AND lease_owner = u_owner AND state = running
        RETURNING parent_id INTO par;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'task % is no longer leased to %', u_id, u_owner
                USING ERRCODE = 'SW002';
        END IF;
        IF u_parent_known THEN
            par := u_parent;
        END IF;
        IF u_wake_if_settled IS NOT NULL THEN  -- due at once if one settled already
            UPDATE tasks SET run_after = 0.0 WHERE id = u_id AND EXISTS (
                SELECT 1 FROM tasks o WHERE o.id = ANY(u_wake_if_settled)
                AND o.state IN ('done', 'failed', 'interrupted'));
        END IF;
        IF u_wake_self THEN
            {_WAKE.format(id="u_id").strip()}
        ELSIF u_settles AND par IS NOT NULL THEN
            -- Locked before the look at its children: two children settling together
            -- would each see the other running.
            PERFORM 1 FROM tasks WHERE id = par FOR UPDATE;
            {_WAKE.format(id="par").strip()}
        END IF;
    END IF;

    IF w_ids IS NOT NULL THEN  -- sleepers woken early, after our own row
        UPDATE tasks SET run_after = 0.0, updated_at = p_now
        WHERE id = ANY(w_ids) AND state = pending;
    END IF;
    seq_bases := bases;
    deduped_ids := deduped;
    IF c_owner IS NOT NULL THEN  -- the claim that takes the freed slot (hotpath CLAIM_PG)
        RETURN QUERY
        WITH expired AS (
            SELECT id FROM tasks WHERE state = 'running' AND lease_expires < p_now
                AND lease_owner <> c_owner
            ORDER BY lease_expires LIMIT c_limit FOR UPDATE SKIP LOCKED),
        due AS (
            SELECT id FROM tasks WHERE state = 'pending' AND run_after <= p_now
            ORDER BY run_after, id LIMIT c_limit FOR UPDATE SKIP LOCKED),
        claimed AS (
            UPDATE tasks SET state = 'running', lease_owner = c_owner,
                lease_expires = c_expires, updated_at = p_now,
                crashes = CASE WHEN state = 'running' THEN crashes + 1 ELSE crashes END,
                crashed_since = CASE WHEN state = 'running'
                                     THEN coalesce(crashed_since, p_now)
                                     ELSE crashed_since END,
                phase = CASE WHEN {_RIDES} THEN 'effect' ELSE phase END,
                checkpoint = CASE WHEN {_RIDES} THEN c_ride ELSE checkpoint END
            FROM (SELECT id FROM expired UNION ALL SELECT id FROM due LIMIT c_limit)
                AS picked
            WHERE tasks.id = picked.id
            RETURNING tasks.*)
        SELECT bases, deduped, claimed::tasks FROM claimed;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    claimed_task := NULL;
    RETURN NEXT;
END"""


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(text(f"CREATE OR REPLACE FUNCTION {_SIGNATURE} RETURNS TABLE ("
                    "seq_bases bigint[], deduped_ids text[], claimed_task tasks) "
                    f"LANGUAGE plpgsql AS $step${_BODY}$step$"))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(text(f"DROP FUNCTION IF EXISTS {_SIGNATURE}"))
