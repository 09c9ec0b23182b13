"""The store's outage as the world brings it, under the runner in-process: a real SQLite
store whose disk is "full" (SQLite's own SQLITE_FULL: `max_page_count` lowered under it),
and a PostgreSQL server of the test's own that goes away and comes back. The claim loop
waits it out and carries on by itself, logging once when it starts and once when it ends;
a task whose commit the outage refused is handed back untouched and finishes exactly once;
any other error of the claim loop ends `run` (so `steward run` exits and is restarted).
Also what tells the store's outage from the rest (`store.is_unavailable`), on real errors.
"""

import asyncio
import errno
import logging
import sqlite3

import pytest

from bot.runtime import Done, Effect, Policy, Registry, Runner, RunnerOptions, TaskDef
from bot.runtime.supervision import Health, read_health
from store import DONE, Writes, is_unavailable, open_store
from tests.fakes.pg_cluster import pg_fixture  # noqa: F401 - a fixture

FAST = RunnerOptions(concurrency=4, lease_seconds=3, max_attempts=3, outage_attempts=6,
                     retry_base_seconds=0.01, retry_max_seconds=0.02, poll_seconds=0.05)


async def _pages(store) -> int:
    return await store._writer.run(lambda s: s.raw.execute("PRAGMA page_count").fetchone()[0])


async def _disk_full(store, full: bool) -> None:
    """SQLITE_FULL for every write that needs a new page (reads go on), or not."""
    limit = await _pages(store) if full else 1 << 30
    await store._writer.run(lambda s: s.raw.execute(f"PRAGMA max_page_count = {limit}"))


class Gate(Effect):
    """Waits for the test to open the gate, then writes a big result (a new page)."""

    kind = "gate"
    policy = Policy.SAFE

    def __init__(self):
        self.opened = asyncio.Event()
        self.started = asyncio.Event()
        self.calls = 0

    async def perform(self, ctx):
        self.calls += 1
        self.started.set()
        await self.opened.wait()
        return {"blob": "x" * 200_000}


class Writer(TaskDef):
    """Each run spawns the next (new rows each time), `n` times."""

    kind = "writer"

    async def step(self, ctx):
        n = ctx.inputs["n"]
        if n > 1:
            ctx.spawn("writer", {"n": n - 1, "pad": "y" * 5000})
        return Done({"n": n})


async def test_a_full_disk_is_waited_out_and_the_task_finishes_once(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'steward.db'}")
    gate = Gate()
    health = Health(tmp_path)
    runner = Runner(store, Registry(gate, Writer()), FAST, health=health.loop("runner"))
    try:
        w = Writes()
        task_id = w.spawn("gate", {})
        await store.commit(w)
        await runner.recover(steal_all=True)
        serving = asyncio.create_task(runner.run())
        await asyncio.wait_for(gate.started.wait(), 10)
        await _disk_full(store, True)
        gate.opened.set()  # its result commit meets the full disk
        w = Writes()
        w.spawn("writer", {"n": 1, "pad": "z" * 200_000})  # needs new pages, whatever is free
        with pytest.raises(sqlite3.OperationalError, match="full") as refused:
            await store.commit(w)
        assert is_unavailable(refused.value)
        for _ in range(1500):  # the runner notices (its task's commit or its own claim)
            if runner.waiting_for_store:
                break
            await asyncio.sleep(0.02)
        assert runner.waiting_for_store and not serving.done()
        await asyncio.sleep(1.0)  # a while full: retried, not logged again
        await _disk_full(store, False)
        w = Writes()
        w.spawn("writer", {"n": 3})
        await store.commit(w)
        for _ in range(3000):  # a busy box: generous
            state, result, _ = await store.task_outcome(task_id)
            done = [t for t in await store.list_tasks(kind="writer") if t.state == DONE]
            if state == DONE and len(done) == 3:
                break
            await asyncio.sleep(0.02)
        assert state == DONE and result == {"blob": "x" * 200_000}
        assert len(done) == 3
        assert gate.calls == 1  # its outcome waited for the store: the effect ran once
        task = await store.get_task(task_id)
        assert task.crashes == 0 and task.attempts == 0
        assert not serving.done()
        said = [r.getMessage() for r in caplog.records]
        # Once each way for each loop that met it (the commits; the claims, maybe).
        assert 1 <= sum("the store is unavailable" in m for m in said) <= 2, said
        assert sum("the store is back" in m for m in said) == sum(
            "the store is unavailable" in m for m in said), said
        assert not any(r.exc_info for r in caplog.records if r.name.startswith("bot.")), said
        assert runner.commits.outages == 1
        runner.stop()
        await asyncio.wait_for(serving, 60)
    finally:
        await store.close()


class Broken(Exception):
    pass


async def test_any_other_error_of_the_claim_loop_ends_run(tmp_path):
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'steward.db'}")

    async def next_due():
        raise Broken("a bug, not an outage")

    store.next_due = next_due  # the loop asks when the next task is due, and fails
    runner = Runner(store, Registry(Writer()), FAST)
    try:
        with pytest.raises(Broken):
            await asyncio.wait_for(runner.run(), 10)
    finally:
        await store.close()


async def test_health_is_written_for_doctor_and_the_inspector(tmp_path):
    health = Health(tmp_path)
    loop = health.loop("runner")
    publishing = asyncio.create_task(health.publish(every=0.05))
    try:
        await loop.wait_out(sqlite3.OperationalError("database or disk is full"))
        await asyncio.sleep(0.2)
        seen = read_health(tmp_path)
        assert seen["loops"]["runner"]["state"] == "waiting for the store"
        assert "disk is full" in seen["loops"]["runner"]["error"]
        assert (tmp_path / "health.json").stat().st_mode & 0o777 == 0o600
        loop.progressed()
        await asyncio.sleep(0.2)
        assert read_health(tmp_path)["loops"]["runner"]["state"] == "ok"
    finally:
        publishing.cancel()
    with pytest.raises(ValueError):  # not an outage: raised as it is
        await loop.wait_out(ValueError("bad data"))


# -- PostgreSQL going away and coming back -------------------------------------------------


async def test_postgres_going_away_is_waited_out(pg, caplog):
    caplog.set_level(logging.INFO)
    store = await open_store(pg.url)
    runner = Runner(store, Registry(Writer()), FAST)
    try:
        await runner.recover(steal_all=True)
        serving = asyncio.create_task(runner.run())
        await pg.stop("immediate")
        with pytest.raises(Exception) as refused:
            await store.get_task("nothing")
        assert is_unavailable(refused.value), refused.value
        # (Met while the server shuts down, it may be "back" for a moment, then away again.)
        for _ in range(300):
            if runner.health.outages:
                break
            await asyncio.sleep(0.02)
        assert runner.health.outages >= 1 and not serving.done()
        await asyncio.sleep(1.0)
        await pg.start()
        w = Writes()
        w.spawn("writer", {"n": 3})
        for _ in range(100):  # the client's pool finds the server again
            try:
                await store.commit(w)
                break
            except Exception as exc:
                assert is_unavailable(exc), exc
                await asyncio.sleep(0.1)
        for _ in range(500):
            done = [t for t in await store.list_tasks(kind="writer") if t.state == DONE]
            if len(done) == 3:
                break
            await asyncio.sleep(0.02)
        assert len(done) == 3 and not serving.done()
        said = [r.getMessage() for r in caplog.records]
        assert 1 <= sum("runner: the store is unavailable" in m for m in said) <= 2, said
        runner.stop()
        await asyncio.wait_for(serving, 60)
    finally:
        await store.close()


async def test_what_is_and_is_not_the_stores_outage(pg, tmp_path):
    store = await open_store(pg.url)
    try:
        await store.ensure_conversation("cli:a")
        with pytest.raises(Exception) as duplicate:  # a constraint: the data's fault
            await store.fork("cli:a", "cli:a")
        assert not is_unavailable(duplicate.value)
    finally:
        await store.close()
    conn = sqlite3.connect(tmp_path / "x.db")
    with pytest.raises(sqlite3.OperationalError) as missing:
        conn.execute("SELECT * FROM nowhere")
    assert not is_unavailable(missing.value)
    # A plain socket or disk error of someone else's (a connector's server, its journal)
    # is not the store's.
    with pytest.raises(OSError) as reset:
        raise ConnectionResetError(errno.ECONNRESET, "reset by peer")
    assert not is_unavailable(reset.value)
    with pytest.raises(OSError) as full:
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not is_unavailable(full.value)


def test_a_connection_left_mid_operation_by_a_restart_is_the_stores_outage():
    """What asyncpg says of a connection a server restart left in the middle of an
    operation, seen by the claim loop when SQLAlchemy set up a fresh one during a restart
    (the full run under load): the server's going away, not a fault of the code."""
    from asyncpg.exceptions._base import InternalClientError
    from sqlalchemy.exc import InternalError

    said = InternalClientError("cannot switch to state 11; another operation (2) is in "
                               "progress")
    assert is_unavailable(InternalError("show transaction isolation level", (), said))
    assert not is_unavailable(InternalClientError("unexpected message type"))


class Slow(Effect):
    """Takes `seconds`, counting its runs by task."""

    kind = "slow"
    policy = Policy.SAFE

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.runs: dict[str, int] = {}

    async def perform(self, ctx):
        self.runs[ctx.task.id] = self.runs.get(ctx.task.id, 0) + 1
        await asyncio.sleep(self.seconds)
        return "done"


# Leases long enough that a restart slowed by a loaded machine (2.7 s seen at load 14)
# does not let them run out: the restart tests are about the liveness locks.
RESTARTED = RunnerOptions(concurrency=4, lease_seconds=9, poll_seconds=0.05,
                          retry_base_seconds=0.01, retry_max_seconds=0.02)


async def four_slow_tasks(store, runners) -> list[str]:
    w = Writes()
    ids = [w.spawn("slow", {"n": n}) for n in range(4)]
    await store.commit(w)
    for r in runners:
        await r.recover(steal_all=False)
    return ids


async def running(slow, n: int) -> None:
    for _ in range(300):
        if len(slow.runs) == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{len(slow.runs)} of {n} tasks started")


async def finished(store, ids) -> bool:
    for _ in range(1000):
        if [(await store.task_outcome(i))[0] for i in ids] == [DONE] * len(ids):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_restart_of_postgres_is_not_taken_for_the_death_of_the_other_workers(pg):
    """Every worker's liveness lock goes with the server; each takes its own again at its
    next renewal, so none is taken for dead and its work run twice."""
    slow = Slow(12.0)
    stores = [await open_store(pg.url) for _ in range(2)]
    runners = [Runner(s, Registry(slow), RESTARTED) for s in stores]
    try:
        ids = await four_slow_tasks(stores[0], runners)
        serving = [asyncio.create_task(r.run()) for r in runners]
        await running(slow, 4)
        await pg.restart("fast")
        assert await finished(stores[0], ids)
        assert slow.runs == {i: 1 for i in ids}, slow.runs
        assert [(await stores[0].get_task(i)).crashes for i in ids] == [0] * 4
        for r in runners:
            r.stop()
        await asyncio.wait_for(asyncio.gather(*serving), 15)
    finally:
        for s in stores:
            await s.close()


async def test_a_worker_slow_to_take_its_lock_again_after_a_restart_is_not_taken_for_dead(pg):
    """On a loaded machine one worker took its lock again late after the restart (a full
    run beside two others and a CPU hog: all four tasks of one worker ran twice): the
    other, which lost its own lock too, does not count it dead while its leases hold. Here
    the first worker renews its leases all along but takes its lock again only after the
    second has looked at the locks twice since the restart, which was enough to be taken
    for dead before."""
    slow = Slow(12.0)
    stores = [await open_store(pg.url) for _ in range(2)]
    runners = [Runner(s, Registry(slow), RESTARTED) for s in stores]
    restarting, looks = asyncio.Event(), []  # looks: the second's, once it relocked
    first_announce, second_announce = stores[0].announce_worker, stores[1].announce_worker

    async def late_after_the_restart(owner):
        if restarting.is_set() and len(looks) < 2:
            return False  # its lock not taken again yet (or still held, before the restart)
        return await first_announce(owner)

    async def counting_the_looks(owner):
        relocked = await second_announce(owner)  # a look at the others' locks follows
        if relocked or looks:
            looks.append(relocked)
        return relocked

    stores[0].announce_worker = late_after_the_restart
    stores[1].announce_worker = counting_the_looks
    serving = []
    try:
        ids = await four_slow_tasks(stores[0], runners)
        serving.append(asyncio.create_task(runners[0].run()))  # all four run on the first
        await running(slow, 4)
        serving.append(asyncio.create_task(runners[1].run()))
        await asyncio.sleep(1.5)  # the second serving too, its lock held
        restarting.set()
        await pg.restart("fast")
        assert await finished(stores[1], ids)
        assert len(looks) >= 2, looks  # the first was without its lock at two looks
        assert slow.runs == {i: 1 for i in ids}, slow.runs
    finally:
        for r in runners:
            r.stop()
        await asyncio.wait_for(asyncio.gather(*serving, return_exceptions=True), 15)
        for s in stores:
            await s.close()


async def test_a_hot_path_connection_the_server_shut_down_under_a_statement_is_not_kept(pg):
    """A statement the server shut down under fails with its reason (57P01, as an error of
    the server's): the connection is gone all the same, and the pool must not hand it to
    the next use (a commit once failed so: "another operation is in progress")."""
    store = await open_store(pg.url)
    try:
        pool = await store.engines.pool()

        async def sleep_in_the_server():
            async with pool.acquire() as conn:
                await conn.fetchval("SELECT pg_sleep(30)")

        sleeping = asyncio.create_task(sleep_in_the_server())
        await asyncio.sleep(0.5)
        await pg.restart("fast")
        with pytest.raises(Exception) as shut:
            await sleeping
        assert is_unavailable(shut.value), shut.value
        for _ in range(3):
            async with pool.acquire() as conn:
                assert await conn.fetchval("SELECT 1") == 1
    finally:
        await store.close()


async def test_a_suspect_is_put_off_for_other_work_once_not_in_every_life(tmp_path):
    """A task that was running at three deaths runs alone, after the other ready work, for
    up to `suspect_defer_seconds` from its first death (kept with the task), not from each
    life's start: restarted every few seconds under a steady load, it would otherwise wait
    for ever, die now and then in the rare lives it ran, and be taken for a poison."""
    from sqlalchemy import update

    from store.records import now
    from store.schema import tasks

    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'steward.db'}")
    slow = Slow(0.05)
    try:
        w = Writes()
        suspect = w.spawn("slow", {"n": "suspect"})
        others = [w.spawn("slow", {"n": n}) for n in range(400)]  # ready work, for a while
        await store.commit(w)
        await store._write(lambda conn: conn.execute(update(tasks).where(
            tasks.c.id == suspect).values(crashes=3, crashed_since=now() - 60)))
        # A new life of the process: its first death was a minute ago.
        runner = Runner(store, Registry(slow), RunnerOptions(
            concurrency=2, poll_seconds=0.05, suspect_crashes=3, suspect_defer_seconds=30))
        serving = asyncio.create_task(runner.run())
        for _ in range(400):
            if suspect in slow.runs:
                break
            await asyncio.sleep(0.02)
        left = sum(1 for i in others if i not in slow.runs)
        assert suspect in slow.runs and left > 100, (suspect in slow.runs, left)
        runner.stop()
        await asyncio.wait_for(serving, 60)
    finally:
        await store.close()
