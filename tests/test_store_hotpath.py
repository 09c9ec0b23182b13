"""The task queue's hot path: claims that read only the rows they take (checked in the
database's own plan), the fixed statements' behaviour on both backends, and SQLite's group
commit (a failing step undoes only itself; nobody hears "done" before the COMMIT; a process
killed mid-group loses nothing it acknowledged)."""

import asyncio
import os
import signal
import sqlite3
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import event, insert, text
from sqlalchemy.engine import Engine

from store import (
    DONE,
    FAILED,
    PENDING,
    RUNNING,
    Claim,
    LeaseLost,
    TaskUpdate,
    Writes,
    new_id,
    open_store,
)
from store import hotpath as _hot
from store.hotpath import explain_claim
from store.records import now
from store.schema import tasks

ROOT = Path(__file__).resolve().parent.parent
READY = 20_000
sqlite_only = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)


def _task_rows(n: int, **values) -> list[dict]:
    t = now()
    row = dict(kind="q", state=PENDING, phase="", inputs="{}", attempts=0, crashes=0,
               run_after=0.0, created_at=t, updated_at=t)
    row.update(values)
    return [dict(row, id=new_id()) for _ in range(n)]


# -- claims ---------------------------------------------------------------------------------


async def test_a_claim_reads_only_the_rows_it_takes(store, store_url):
    # A deep queue, a long history of finished work, sleepers and live leases: none of it
    # may be read, let alone sorted, to take the next few tasks.
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), _task_rows(READY))
        await conn.execute(insert(tasks), _task_rows(5_000, state=DONE))
        await conn.execute(insert(tasks), _task_rows(2_000, run_after=now() + 3600))
        await conn.execute(insert(tasks), _task_rows(500, state=RUNNING, lease_owner="w",
                                                     lease_expires=now() + 3600))
        await conn.execute(text("ANALYZE"))
    plan = await explain_claim(store.engines)
    if store.dialect == "sqlite":
        assert "ix_tasks_ready (run_after<?)" in plan, plan
        assert "ix_tasks_leases (lease_expires<?)" in plan, plan
        assert "TEMP B-TREE" not in plan, plan
        assert "SCAN tasks" not in plan, plan
    else:  # the generic plan the hot path runs
        assert "Index Scan using ix_tasks_ready" in plan, plan
        assert "Index Scan using tasks_pkey" in plan, plan
        assert "Seq Scan" not in plan, plan
        # Ready work in index order, never sorted. Expired leases (a dead worker's tasks in
        # flight, not the queue) are found by their index and may be sorted.
        assert "ix_tasks_leases" in plan, plan
        sorts = [line for line in plan.splitlines() if "Sort Key" in line]
        assert all("lease_expires" in line for line in sorts), plan
    claimed = await store.claim_tasks("me", 8, 30)
    assert len(claimed) == 8 and all(t.state == RUNNING for t in claimed)


async def test_a_claim_takes_expired_leases_then_the_oldest_due(store):
    w = Writes()
    fresh = w.spawn("q", {})
    sleeper = w.spawn("q", {}, run_after=now() + 3600)
    await store.commit(w)
    w = Writes()
    retried = w.spawn("q", {})  # made later, but its retry came due a minute ago
    await store.commit(w)
    [orphan] = _task_rows(1, state=RUNNING, lease_owner="dead", lease_expires=now() - 1)
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), [orphan])
        await conn.execute(text("UPDATE tasks SET run_after = :t WHERE id = :i"),
                           {"t": now() - 60, "i": retried})
    first = await store.claim_tasks("me", 1, 30)
    assert [t.id for t in first] == [orphan["id"]] and first[0].crashes == 1
    assert first[0].crashed_since is not None
    second = await store.claim_tasks("me", 1, 30)
    assert [t.id for t in second] == [retried]
    rest = await store.claim_tasks("me", 8, 30)
    assert [t.id for t in rest] == [fresh]
    assert (await store.get_task(sleeper)).state == PENDING


async def test_a_lone_update_is_fenced_by_the_lease_and_keeps_text_storable(store):
    w = Writes()
    task_id = w.spawn("q", {})
    await store.commit(w)
    await store.claim_tasks("me", 1, 30)
    with pytest.raises(LeaseLost):
        await store.commit(_update(TaskUpdate(task_id, "someone else", DONE, "")))
    await store.commit(_update(TaskUpdate(task_id, "me", RUNNING, "effect",
                                          checkpoint={"claim": "c1"}, progressed=False)))
    task = await store.get_task(task_id)
    assert (task.state, task.phase, task.checkpoint, task.lease_owner) == (
        RUNNING, "effect", {"claim": "c1"}, "me")
    await store.commit(_update(TaskUpdate(task_id, "me", FAILED, "effect",
                                          error="bad\x00byte", attempts=3)))
    task = await store.get_task(task_id)
    assert (task.state, task.error, task.attempts, task.lease_owner) == (
        FAILED, "bad\ufffdbyte", 3, None)


async def test_a_child_settling_by_the_fast_path_still_wakes_its_parent(store):
    w = Writes()
    parent = w.spawn("parent", {})
    await store.commit(w)
    await store.claim_tasks("me", 1, 30)
    w = Writes()
    children = [w.spawn("child", {}, parent_id=parent) for _ in range(2)]
    w.update_task(TaskUpdate(parent, "me", "waiting", "wait", wait_mode="all"))
    await store.commit(w)
    assert [t.id for t in await store.claim_tasks("me", 8, 30)] == children
    await store.commit(_update(TaskUpdate(children[0], "me", DONE, "")))
    assert (await store.get_task(parent)).state == "waiting"
    await store.commit(_update(TaskUpdate(children[1], "me", FAILED, "", error="no")))
    assert (await store.get_task(parent)).state == PENDING


def _update(u: TaskUpdate) -> Writes:
    w = Writes()
    w.update_task(u)
    return w


# -- group commit (SQLite) ------------------------------------------------------------------


async def _hold_writer(store) -> tuple[threading.Event, asyncio.Future]:
    """Keep the writer busy so the next commits queue up into one group."""
    gate, started = threading.Event(), threading.Event()

    def hold(_session):
        started.set()
        gate.wait(10)

    held = asyncio.ensure_future(store._writer.run(hold))
    await asyncio.to_thread(started.wait, 10)
    return gate, held


def _entry(conv_id: int, ref: str) -> Writes:
    w = Writes()
    w.append(conv_id, "user", ref, ref=ref)
    return w


@sqlite_only
async def test_one_failing_step_in_a_group_undoes_only_itself(store):
    conv = await store.ensure_conversation("cli:group")
    w = Writes()
    task_id = w.spawn("q", {})
    w.submit("cli", "seen")
    await store.commit(w)
    await store.claim_tasks("me", 1, 30)
    gate, held = await _hold_writer(store)
    before = store._writer.transactions
    lost = _entry(conv.id, "lost")  # its entry is written before its update is refused
    lost.update_task(TaskUpdate(task_id, "not the owner", DONE, ""))
    dup = _entry(conv.id, "dup")
    dup.submit("cli", "seen")
    steps = [asyncio.ensure_future(store.commit(w))
             for w in (_entry(conv.id, "a"), lost, dup, _entry(conv.id, "b"))]
    await asyncio.sleep(0.05)
    gate.set()
    await held
    a, refused, duplicate, b = await asyncio.gather(*steps, return_exceptions=True)
    assert isinstance(refused, LeaseLost) and duplicate.duplicate
    assert a.entry_seqs == [1] and b.entry_seqs == [2]
    assert store._writer.transactions - before == 2  # the held one, then all four together
    page = await store.entries_page(conv.id)
    assert [(e.seq, e.ref) for e in page] == [(1, "a"), (2, "b")]
    assert (await store.get_task(task_id)).state == RUNNING


@sqlite_only
async def test_nobody_in_a_group_hears_done_before_its_commit(store):
    conv = await store.ensure_conversation("cli:group")
    gate, held = await _hold_writer(store)

    def breaks_the_commit(s):  # a deferred constraint: only the COMMIT finds it
        s.raw.execute("PRAGMA defer_foreign_keys = ON")
        s.raw.execute("INSERT INTO tasks (id, kind, parent_id, state, phase, inputs, attempts,"
                      " crashes, run_after, created_at, updated_at) VALUES ('orphan', 'q', "
                      "'no such parent', 'done', '', '{}', 0, 0, 0, 0, 0)")

    first = asyncio.ensure_future(store.commit(_entry(conv.id, "first")))
    breaker = asyncio.ensure_future(store._writer.run(breaks_the_commit))
    last = asyncio.ensure_future(store.commit(_entry(conv.id, "last")))
    await asyncio.sleep(0.05)
    gate.set()
    await held
    outcomes = await asyncio.gather(first, breaker, last, return_exceptions=True)
    assert all(isinstance(o, sqlite3.IntegrityError) for o in outcomes), outcomes
    assert await store.entries_page(conv.id) == []
    assert (await store.commit(_entry(conv.id, "after"))).entry_seqs == [1]


_WORKER = """
import asyncio, os, signal, sys, threading
from store import Writes, open_store

async def main(url, mode):
    store = await open_store(url)
    conv = await store.ensure_conversation("cli:kill")

    async def commit(ref):
        w = Writes()
        w.append(conv.id, "user", ref, ref=ref)
        await store.commit(w)
        print(ref, flush=True)  # acknowledged: the commit returned

    if mode == "load":  # 64 writers at once: the writer is always in the middle of a group
        async def writer(n):
            for i in range(10**6):
                await commit(f"{n}.{i}")
        await asyncio.gather(*(writer(n) for n in range(64)))
    for i in range(20):
        await commit(f"early.{i}")
    gate = threading.Event()
    held = asyncio.ensure_future(store._writer.run(lambda s: gate.wait(10)))
    await asyncio.sleep(0.1)
    group = [asyncio.ensure_future(commit(f"group.{i}")) for i in range(5)]
    group.append(asyncio.ensure_future(store._writer.run(
        lambda s: os.kill(os.getpid(), signal.SIGKILL))))  # after five steps, before COMMIT
    group += [asyncio.ensure_future(commit(f"group.{i}")) for i in range(5, 10)]
    await asyncio.sleep(0.1)
    gate.set()
    await asyncio.gather(held, *group)

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def _killed_worker(url: str, mode: str, kill_after: int | None) -> list[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _WORKER, url, mode, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    acked = []
    while kill_after is None or len(acked) < kill_after:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        if not line:
            break
        acked.append(line.decode().strip())
    if kill_after is not None:
        proc.send_signal(signal.SIGKILL)
    rest, err = await asyncio.wait_for(proc.communicate(), 60)
    acked += rest.decode().split()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    return acked


@sqlite_only
@pytest.mark.parametrize("mode, kill_after", [("load", 700), ("load", 1500),
                                              ("group", None)])
async def test_a_process_killed_mid_group_loses_nothing_it_acknowledged(store_url, mode,
                                                                         kill_after):
    acked = await _killed_worker(store_url, mode, kill_after)
    store = await open_store(store_url)
    try:
        conv = await store.get_conversation("cli:kill")
        stored, before = [], None
        while page := await store.entries_page(conv.id, before=before, limit=500):
            stored = [e.ref for e in page] + stored
            before = page[0].seq
    finally:
        await store.close()
    assert set(acked) <= set(stored)
    assert len(stored) == len(set(stored)) == conv.last_seq  # no gap, no half of a step
    if mode == "group":  # the group died before its COMMIT: none of it is there
        assert acked == [f"early.{i}" for i in range(20)] == stored
    else:
        assert len(acked) >= kill_after


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)  # one statement there
async def test_a_result_that_claims_takes_the_claimed_rows_by_primary_key(store):
    """PostgreSQL's update-then-claim statement, on a table of a few thousand tasks (small
    enough for the planner to scan it whole for an array of ids it guesses at ten)."""
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), _task_rows(2_000))
        await conn.execute(insert(tasks), _task_rows(2_000, state=DONE))
    plan = await explain_claim(store.engines, 1, after_update=True)
    assert "Index Scan using tasks_pkey" in plan, plan
    assert "Seq Scan" not in plan, plan


async def test_claims_in_a_fresh_handle_without_statistics_use_the_indexes(store_url):
    # No ANALYZE: the plan must not depend on statistics a new database does not have.
    store = await open_store(store_url)
    try:
        async with store.engines.write.begin() as conn:
            await conn.execute(insert(tasks), _task_rows(READY))
        plan = await explain_claim(store.engines)
    finally:
        await store.close()
    assert "ix_tasks_ready" in plan and "ix_tasks_leases" in plan, plan
    assert "TEMP B-TREE" not in plan and "Seq Scan" not in plan, plan


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_hot_statements_are_planned_once_not_at_every_step(store):
    """Once a table has statistics (autovacuum analyzes any busy one), PostgreSQL's default
    plan cache chose a fresh custom plan for the claim and the update-then-claim at every
    execution: planning cost more than running them (0.87 against 0.51 ms a step, over
    asyncpg alone). The hot path's connections keep the one generic plan, and it still
    reads only the rows it takes."""
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), _task_rows(READY))
        await conn.execute(insert(tasks), _task_rows(2_000, state=DONE))
        await conn.execute(text("ANALYZE tasks"))
    steps = 12  # PostgreSQL weighs a generic plan after five custom ones
    async with (await store.engines.pool()).acquire() as conn:
        [task] = await _hot.pg_claim(conn, Claim("me", 1, 30.0), now())
        for _ in range(steps):
            [task] = await _hot.pg_update_then_claim(
                conn, TaskUpdate(task.id, "me", DONE, "", result={"ok": True}),
                Claim("me", 1, 30.0), now())
            await _hot.pg_claim(conn, Claim("me", 0, 30.0), now())
        plans = await conn.fetch(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE '%FOR UPDATE SKIP LOCKED%' "
            "AND statement NOT LIKE '%pg_prepared_statements%'")
    assert len(plans) == 2, plans
    for row in plans:
        assert row["custom_plans"] == 0 and row["generic_plans"] >= steps, dict(row)
    plan = await explain_claim(store.engines, 1, after_update=True)
    assert "Index Scan using ix_tasks_ready" in plan and "Seq Scan" not in plan, plan


_LIVE = ("ix_tasks_ready", "ix_tasks_leases", "ix_tasks_blocked")


async def _explain(store, statement: str, parameters) -> str:
    """The plan of a statement the store ran: on PostgreSQL the generic one (the state is
    in the statement, so it cannot depend on the values)."""
    if store.dialect == "sqlite":
        async with store.engines.read.connect() as conn:
            rows = (await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}",
                                               tuple(parameters))).all()
        return "\n".join(str(r[-1]) for r in rows)
    async with (await store.engines.pool()).acquire() as conn:
        await conn.execute(f"PREPARE steward_t AS {statement}")
        nulls = f"({', '.join(['NULL'] * len(parameters))})" if parameters else ""
        try:
            rows = await conn.fetch(f"EXPLAIN EXECUTE steward_t{nulls}")
        finally:
            await conn.execute("DEALLOCATE steward_t")
    return "\n".join(r[0] for r in rows)


async def test_the_queues_other_queries_read_only_live_work(store):
    """After years the tasks table is mostly finished work. The runner's next-due poll,
    the start's recovery (leases nobody holds, blocked kinds now registered) and the search
    for dead workers find their rows in the partial indexes of live work, never by reading
    the table."""
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), _task_rows(READY, state=DONE))
        await conn.execute(insert(tasks), _task_rows(200))
        await conn.execute(insert(tasks), _task_rows(50, state=RUNNING, lease_owner="gone",
                                                     lease_expires=now() - 60))
        await conn.execute(insert(tasks), _task_rows(20, state="blocked"))
        await conn.execute(text("ANALYZE"))
    ran: list[tuple[str, tuple]] = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        if "tasks" in statement and "state" in statement:
            ran.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", seen)
    try:
        assert await store.next_due() is not None
        counts = await store.recover_tasks(steal_all=False, registered_kinds=["q"])
        if not store.single_node:
            await store.take_over_dead()
    finally:
        event.remove(Engine, "before_cursor_execute", seen)
    assert counts == {"resumed": 50, "unblocked": 20}, counts
    assert len(ran) >= 3, ran
    for statement, parameters in ran:
        plan = await _explain(store, statement, parameters)
        assert any(index in plan for index in _LIVE), (statement, plan)
        if store.dialect == "sqlite":
            scans = [line for line in plan.splitlines() if line.startswith("SCAN tasks")]
            assert all(any(index in line for index in _LIVE) for line in scans), plan
        else:
            assert "Seq Scan on tasks" not in plan, (statement, plan)


async def _plans_inside_a_step(store, writes: Writes, claim: Claim | None) -> str:
    """The plans `steward_step` runs for one step, as auto_explain reports them to the
    client (nested statements included), on a hot-path connection: the generic plans."""
    from store.postgres import step_function as _steps

    logged: list[str] = []
    async with (await store.engines.pool()).acquire() as conn:
        conn.add_log_listener(lambda _conn, message: logged.append(message.message))
        await conn.execute("LOAD 'auto_explain'")
        await conn.execute("SET auto_explain.log_min_duration = 0; "
                           "SET auto_explain.log_nested_statements = on; "
                           "SET client_min_messages = log")
        try:
            await _steps.on_postgres(conn, writes, now(), "?", claim)
        finally:
            await conn.execute("RESET client_min_messages; "
                               "RESET auto_explain.log_min_duration")
            conn.remove_log_listener(logged.append)
    await asyncio.sleep(0)  # log messages are delivered by call_soon
    return "\n".join(logged)


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("queued", [6_000, 3])
async def test_a_tasks_own_update_finds_it_by_its_key_not_along_a_queue_index(store,
                                                                               queued):
    """The fenced update names its task by id and reads `state = 'running'`, which is
    ix_tasks_leases' condition: with a queue and a history (6,000 queued, 5,000 done) and
    one task running, PostgreSQL took that small index for it, a scan of every entry in it,
    the dead ones too until vacuum, where the primary key finds one row (measured: 65
    buffers and 0.11 ms of a 0.33 ms step). The same for the sleepers a step wakes
    (`state = 'pending'`, ix_tasks_ready's condition) when the queue is short."""
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), _task_rows(queued))
        await conn.execute(insert(tasks), _task_rows(5_000, state=DONE))
        await conn.execute(insert(tasks), _task_rows(1, state=RUNNING, lease_owner="w",
                                                     lease_expires=now() + 3600))
        await conn.execute(text("ANALYZE tasks"))
    plans = {}
    plan = await explain_claim(store.engines, 1, after_update=True)
    plans["update then claim"] = plan.split("CTE finished", 1)[1].split("CTE expired")[0]
    update_params = _hot.update_params(TaskUpdate("x", "x", DONE, ""), now())
    async with (await store.engines.pool()).acquire() as conn:
        await conn.execute(f"PREPARE lone AS {_hot.UPDATE_ASYNCPG}")
        plans["lone update"] = "\n".join(r[0] for r in await conn.fetch(
            f"EXPLAIN EXECUTE lone({', '.join(['NULL'] * len(update_params))})"))
        await conn.execute("DEALLOCATE lone")

    [task] = await store.claim_tasks("me", 1, 60.0)
    sleeper = new_id()
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), [dict(_task_rows(1, run_after=now() + 3600)[0],
                                                id=sleeper)])
    writes = Writes()
    writes.wakes.append(sleeper)
    writes.task_update = TaskUpdate(task.id, "me", DONE, "", result={"ok": True})
    logged = (await _plans_inside_a_step(store, writes, Claim("me", 1, 60.0)))
    statements = logged.split("duration:")
    [plans["steward_step's update"]] = [s for s in statements if "lease_owner = u_owner" in s]
    [plans["steward_step's wakes"]] = [s for s in statements if "id = ANY(w_ids)" in s]
    wrong = {name: plan for name, plan in plans.items()
             if "tasks_pkey" not in plan or "ix_tasks_leases" in plan
             or "ix_tasks_ready" in plan}
    assert not wrong, "\n\n".join(f"{name}:\n{plan}" for name, plan in wrong.items())
