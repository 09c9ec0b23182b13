"""The task runner in-process, on both backends: waits, blocking, dead letters, corrupt
rows, leases and several workers."""

import asyncio

import pytest
from sqlalchemy import insert, select, update

from bot.runtime import (
    Done,
    Effect,
    Fail,
    NotPerformed,
    Policy,
    Registry,
    Runner,
    RunnerOptions,
    TaskDef,
    Unavailable,
    Wait,
)
from store import BLOCKED, DONE, FAILED, PENDING, RUNNING, WAITING, Writes, open_store
from store.records import now
from store.schema import tasks

FAST = RunnerOptions(concurrency=4, lease_seconds=5, max_attempts=3, outage_attempts=6,
                     retry_base_seconds=0.01, retry_max_seconds=0.02, poll_seconds=0.02)


class Echo(Effect):
    kind = "echo"
    policy = Policy.SAFE

    def __init__(self):
        self.calls = []

    async def perform(self, ctx):
        self.calls.append(ctx.task.id)
        if ctx.inputs.get("fail"):
            raise RuntimeError(f"boom {ctx.inputs['fail']}")
        return {"echo": ctx.inputs}


class Flaky(Effect):
    """Fails clean (nothing happened) the first `fails` times."""

    kind = "flaky"
    policy = Policy.UNSAFE

    def __init__(self, fails: int):
        self.fails = fails
        self.calls = 0

    async def perform(self, ctx):
        self.calls += 1
        if self.calls <= self.fails:
            raise NotPerformed("service unavailable")
        return "ok"


class Parent(TaskDef):
    kind = "parent"

    async def step(self, ctx):
        if ctx.phase == "":
            for inputs in ctx.inputs["children"]:
                ctx.spawn("echo", inputs)
            return Wait("gather", {"n": len(ctx.inputs["children"])}, mode=ctx.inputs["mode"])
        children = await ctx.children()
        states = sorted(c.state for c in children)
        if FAILED in states:
            return Fail("a child failed", {"states": states})
        return Done({"states": states, "checkpoint": ctx.checkpoint})


async def run_all(store, *defs, options=FAST, steal_all=True):
    runner = Runner(store, Registry(*defs), options)
    await runner.recover(steal_all=steal_all)
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    return runner


async def spawn(store, kind, inputs, **kw):
    w = Writes()
    task_id = w.spawn(kind, inputs, **kw)
    await store.commit(w)
    return task_id


async def test_parent_waits_for_all_children(store):
    echo = Echo()
    parent = await spawn(store, "parent", {"mode": "all", "children": [{"a": 1}, {"a": 2}]})
    await run_all(store, echo, Parent())
    task = await store.get_task(parent)
    assert task.state == DONE
    assert task.result == {"states": [DONE, DONE], "checkpoint": {"n": 2}}
    assert len(echo.calls) == 2


async def test_siblings_settling_together_wake_the_parent(store):
    # Many children finishing at the same moment on several workers: the last one to
    # commit must see all the others settled (a read-committed race left parents waiting).
    parents = [await spawn(store, "parent", {"mode": "all",
                                             "children": [{"a": i} for i in range(8)]})
               for _ in range(6)]
    options = RunnerOptions(concurrency=16, lease_seconds=5, poll_seconds=0.01)
    await run_all(store, Echo(), Parent(), options=options)
    states = [(await store.get_task(p)).state for p in parents]
    assert states == [DONE] * len(parents)


async def test_fail_fast_wakes_parent_on_first_failure(store):
    release = asyncio.Event()  # the slow child finishes only once the test has looked

    class SlowEcho(Echo):
        async def perform(self, ctx):
            if not ctx.inputs.get("fail"):
                await asyncio.wait_for(release.wait(), 30)
            return await super().perform(ctx)

    parent = await spawn(store, "parent", {"mode": "fail_fast",
                                           "children": [{"fail": 1}, {"slow": 1}]})
    runner = Runner(store, Registry(SlowEcho(), Parent()),
                    RunnerOptions(concurrency=4, max_attempts=1, poll_seconds=0.02))
    await runner.recover(steal_all=True)
    job = asyncio.create_task(runner.run(until_idle=True))
    for _ in range(2000):
        if (await store.get_task(parent)).state == FAILED:
            break
        await asyncio.sleep(0.01)
    slow = [c for c in await store.list_tasks(parent_id=parent) if c.inputs.get("slow")][0]
    assert (await store.get_task(parent)).state == FAILED
    assert (await store.get_task(slow.id)).state != DONE  # parent did not wait for it
    release.set()
    await job
    assert (await store.get_task(slow.id)).state == DONE


async def test_parent_with_all_children_settled_does_not_sleep(store):
    parent = await spawn(store, "parent", {"mode": "all", "children": []})
    await run_all(store, Echo(), Parent())
    assert (await store.get_task(parent)).state == DONE


async def test_unknown_kind_is_blocked_then_resumes_when_registered(store):
    lost = await spawn(store, "echo", {"x": 1})
    other = await spawn(store, "parent", {"mode": "all", "children": []})
    await run_all(store, Parent())  # a build without the echo definition
    blocked = await store.get_task(lost)
    assert blocked.state == BLOCKED
    assert "no definition" in blocked.error
    assert (await store.get_task(other)).state == DONE
    echo = Echo()
    await run_all(store, echo, Parent())
    assert (await store.get_task(lost)).state == DONE
    assert echo.calls == [lost]


async def test_failing_effect_is_dead_lettered_after_max_attempts(store):
    echo = Echo()
    bad = await spawn(store, "echo", {"fail": 1})
    good = await spawn(store, "echo", {"ok": 1})
    await run_all(store, echo)
    task = await store.get_task(bad)
    assert task.state == FAILED
    assert "dead-lettered after 3 attempts" in task.error and "boom 1" in task.error
    assert echo.calls.count(bad) == 3
    assert (await store.get_task(good)).state == DONE
    assert (await store.list_tasks(state=FAILED))[0].id == bad  # visible


async def test_unsafe_effect_that_was_not_performed_is_retried(store):
    flaky = Flaky(fails=2)
    task_id = await spawn(store, "flaky", {})
    await run_all(store, flaky)
    task = await store.get_task(task_id)
    assert (task.state, task.result, flaky.calls) == (DONE, "ok", 3)


async def test_unsafe_effect_that_raises_fails_without_retry(store):
    class Charge(Effect):
        kind = "charge"
        calls = 0

        async def perform(self, ctx):
            Charge.calls += 1
            raise ConnectionError("reset by peer")

    task_id = await spawn(store, "charge", {})
    await run_all(store, Charge())
    task = await store.get_task(task_id)
    assert (task.state, Charge.calls) == (FAILED, 1)
    assert "reset by peer" in task.error


async def test_corrupt_row_is_blocked_and_the_rest_runs(store):
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks).values(
            id="00000000000000000000000000", kind="echo", state=PENDING, phase="",
            inputs="{not json", attempts=0, run_after=0.0, created_at=now(), updated_at=now()))
    good = await spawn(store, "echo", {"ok": 1})
    echo = Echo()
    await run_all(store, echo)
    assert (await store.get_task(good)).state == DONE
    assert echo.calls == [good]
    [listed] = await store.list_tasks(state=BLOCKED)  # reported, not hidden
    assert listed.id == "00000000000000000000000000"
    assert "corrupt tasks row" in listed.error
    assert "corrupt" in listed.inputs


async def test_expired_lease_of_a_dead_worker_is_taken_over(store, store_url):
    echo = Echo()
    task_id = await spawn(store, "echo", {"x": 1})
    other = await open_store(store_url)  # another live worker...
    try:
        await other.announce_worker("other-worker")
        [claimed] = await store.claim_tasks("other-worker", 1, lease_seconds=3)
        assert claimed.id == task_id
        runner = await run_all(store, echo, steal_all=False)
        assert (await store.get_task(task_id)).state == RUNNING  # alive, lease valid: left
        await asyncio.sleep(3.1)  # ...that stops renewing its lease
        await asyncio.wait_for(runner.run(until_idle=True), 10)
        assert (await store.get_task(task_id)).state == DONE
        assert echo.calls == [task_id]
    finally:
        await other.close()


async def test_tasks_of_a_dead_worker_resume_at_once_on_postgres(store):
    echo = Echo()
    task_id = await spawn(store, "echo", {"x": 1})
    # Claimed by a worker whose process is gone: it holds no liveness lock any more.
    await store.claim_tasks("dead-worker", 1, lease_seconds=60)
    await run_all(store, echo, steal_all=False)
    expected = DONE if store.dialect == "postgresql" else RUNNING  # SQLite: the lock file
    assert (await store.get_task(task_id)).state == expected


async def test_two_workers_run_each_task_once(store):
    echo = Echo()
    w = Writes()
    ids = [w.spawn("echo", {"i": i}) for i in range(120)]
    await store.commit(w)
    runners = [Runner(store, Registry(echo), FAST) for _ in range(2)]
    await asyncio.wait_for(asyncio.gather(*(r.run(until_idle=True) for r in runners)), 60)
    assert sorted(echo.calls) == sorted(ids)
    assert (await store.count_tasks()) == {DONE: 120}


async def test_stop_hands_back_between_phases(store):
    class TwoPhase(TaskDef):
        kind = "two"

        async def step(self, ctx):
            if ctx.phase == "":
                runner.stop()
                from bot.runtime import Continue
                return Continue("second", {"first": True})
            return Done(ctx.checkpoint)

    runner = Runner(store, Registry(TwoPhase()), FAST)
    task_id = await spawn(store, "two", {})
    await runner.run()
    task = await store.get_task(task_id)
    assert (task.state, task.phase, task.checkpoint) == (PENDING, "second", {"first": True})
    await run_all(store, TwoPhase())
    assert (await store.get_task(task_id)).result == {"first": True}


async def test_waiting_task_stays_waiting_across_recovery(store):
    parent = await spawn(store, "parent", {"mode": "all", "children": [{"a": 1}]})
    await run_all(store, Parent())  # echo not registered: its child blocks
    assert (await store.get_task(parent)).state == WAITING
    counts = await Runner(store, Registry(Parent())).recover(steal_all=True)
    assert counts["resumed"] == 0
    assert (await store.get_task(parent)).state == WAITING
    await run_all(store, Echo(), Parent())
    assert (await store.get_task(parent)).state == DONE


async def test_lease_is_fenced(store):
    task_id = await spawn(store, "echo", {})
    await store.claim_tasks("w1", 1, lease_seconds=60)
    async with store.engines.write.begin() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == task_id)
                           .values(lease_owner="w2"))
    from store import LeaseLost, TaskUpdate
    w = Writes()
    w.update_task(TaskUpdate(task_id, "w1", DONE, ""))
    try:
        await store.commit(w)
    except LeaseLost:
        pass
    else:
        raise AssertionError("a worker without the lease moved the task on")
    assert (await store.get_task(task_id)).state == RUNNING


async def test_a_phase_whose_writes_the_store_refuses_is_a_failed_attempt(store):
    class BadEdit(Effect):
        kind = "bad_edit"
        policy = Policy.SAFE
        calls = 0

        async def perform(self, ctx):
            BadEdit.calls += 1
            ctx.writes.edit_document("ns", "doc", [{"op": "delete", "path": ["missing"]}])
            ctx.writes.append(conv.id, "user", "must not land")
            return "done?"

    conv = await store.ensure_conversation("cli:bad")
    task_id = await spawn(store, "bad_edit", {})
    await run_all(store, BadEdit())
    task = await store.get_task(task_id)
    assert task.state == FAILED and "dead-lettered after 3 attempts" in task.error
    assert "missing" in task.error
    assert BadEdit.calls == 3
    assert await store.entries_page(conv.id) == []  # nothing of the refused phase landed


async def test_an_effect_whose_service_stays_down_is_dead_lettered_after_the_outage_limit(
        store):
    flaky = Flaky(fails=10**6)
    task_id = await spawn(store, "flaky", {})
    await run_all(store, flaky)
    task = await store.get_task(task_id)
    assert task.state == FAILED and "dead-lettered after 6 attempts" in task.error
    assert flaky.calls == 6  # outage_attempts, not max_attempts, and not forever


class Poster(Effect):
    """An unsafe post whose service drops the connection after taking the post, then
    stays down for a while, so even looking (reconcile) fails for a few tries."""

    kind = "poster"
    policy = Policy.UNSAFE

    def __init__(self, *, lost_after_post: bool, down_for: int):
        self.lost_after_post = lost_after_post
        self.down_for = down_for  # failed reconcile tries before the service answers
        self.posted = 0
        self.looks = 0

    async def perform(self, ctx):
        self.tries = getattr(self, "tries", 0) + 1
        if self.tries == 1:
            if self.lost_after_post:
                self.posted += 1
                raise Unavailable("connection reset after the request was sent")
            raise Unavailable("connection refused")
        self.posted += 1
        return "posted"

    async def reconcile(self, ctx):
        self.looks += 1
        if self.looks <= self.down_for:
            raise Unavailable("still down")
        return (True, "found") if self.posted else (False, None)


async def test_an_outage_in_doubt_is_reconciled_once_the_service_is_back(store):
    # More failed tries than max_attempts (3) but within outage_attempts (6): the post
    # that went through is found, never sent again, and nothing is dead-lettered.
    poster = Poster(lost_after_post=True, down_for=4)
    task_id = await spawn(store, "poster", {})
    await run_all(store, poster)
    task = await store.get_task(task_id)
    assert (task.state, task.result) == (DONE, "found")
    assert poster.posted == 1 and poster.looks == 5


async def test_an_outage_before_the_post_is_looked_at_then_posted_once(store):
    poster = Poster(lost_after_post=False, down_for=2)
    task_id = await spawn(store, "poster", {})
    await run_all(store, poster)
    task = await store.get_task(task_id)
    assert (task.state, task.result) == (DONE, "posted")
    assert poster.posted == 1 and poster.looks == 3


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)  # row locks: PostgreSQL
async def test_lease_renewal_never_waits_for_a_row_another_commit_holds(store):
    # A queued turn's commit share-locks the older turn's row, then wants its own; if the
    # renewal held that one and waited for the older row, the two would deadlock. The
    # renewal skips a locked row instead (renewed next time).
    w = Writes()
    older, sleeper = w.spawn("echo", {}), w.spawn("echo", {})
    await store.commit(w)
    async with store.engines.write.begin() as conn:
        await conn.execute(update(tasks).where(tasks.c.id.in_([older, sleeper]))
                           .values(state=RUNNING, lease_owner="w1", lease_expires=now() + 5))
    async with store.engines.write.connect() as other:
        await other.begin()
        await other.execute(select(tasks.c.id).where(tasks.c.id == older)
                            .with_for_update(read=True))
        renewed = await asyncio.wait_for(store.renew_leases("w1", [older, sleeper], 30), 60)
        await other.rollback()
    assert renewed == 1
    assert (await store.get_task(sleeper)).lease_expires > now() + 20


async def test_a_lease_renewed_late_is_not_claimed_again_by_its_own_worker(store):
    """Under load a renewal can come after the lease ran out (CI saw a safe MCP call start
    twice in one process). The worker still holds the task in memory: its own claim loop
    must not lease it again and run a second copy beside the first, nor count a death."""
    started, release, first = [], asyncio.Event(), asyncio.Event()

    class Slow(Effect):
        kind = "slow"
        policy = Policy.SAFE

        async def perform(self, ctx):
            started.append(ctx.task.id)
            first.set()
            await release.wait()
            return "ok"

    task_id = await spawn(store, "slow", {})
    options = RunnerOptions(concurrency=4, lease_seconds=0.3, poll_seconds=0.02)
    runner = Runner(store, Registry(Slow()), options)

    async def late(owner, task_ids, lease_seconds):  # the renewals that came too late
        return None

    store.renew_leases = late
    running = asyncio.create_task(runner.run(until_idle=True))
    try:
        await asyncio.wait_for(first.wait(), 60)
        await asyncio.sleep(1.0)  # the lease ran out three times over; the claim loop polls
        assert started == [task_id]
        assert (await store.get_task(task_id)).crashes == 0
        release.set()
        await asyncio.wait_for(running, 60)
    finally:
        release.set()
        running.cancel()
    task = await store.get_task(task_id)
    assert (task.state, started) == (DONE, [task_id])
