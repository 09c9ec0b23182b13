"""The claimer's rules (bot/runtime/runner.py docstring), one test each, named after its
rule, on both backends with a real runner."""

import asyncio
import time

from bot.runtime import Done, Effect, Policy, Registry, Runner, RunnerOptions, TaskDef
from store import DONE, PENDING, Writes

FAST = dict(lease_seconds=5, poll_seconds=0.02, retry_base_seconds=0.01,
            retry_max_seconds=0.02)


class Probe(TaskDef):
    """Holds each task a moment and records what ran beside it, and in which asyncio task."""

    kind = "probe"

    def __init__(self, hold: float = 0.03, on_step=None):
        self.hold, self.on_step = hold, on_step
        self.active: set[str] = set()
        self.most = 0
        self.beside: dict[str, set[str]] = {}  # task id -> what else ran while it did
        self.jobs: dict[str, asyncio.Task] = {}
        self.runs: dict[str, int] = {}

    async def step(self, ctx):
        me = ctx.task.id
        self.runs[me] = self.runs.get(me, 0) + 1
        self.jobs[me] = asyncio.current_task()
        self.active.add(me)
        self.most = max(self.most, len(self.active))
        for other in self.active:
            self.beside.setdefault(other, set()).update(self.active - {other})
        if self.on_step is not None:
            await self.on_step(ctx)
        await asyncio.sleep(self.hold)
        self.active.discard(me)
        return Done({"ok": True})


async def spawn(store, kind: str, n: int) -> list[str]:
    w = Writes()
    ids = [w.spawn(kind, {"n": i}) for i in range(n)]
    await store.commit(w)
    return ids


async def states(store, ids) -> list[str]:
    return [(await store.get_task(i)).state for i in ids]


async def test_rule_1_never_more_than_concurrency_tasks_run_here(store):
    probe = Probe()
    ids = await spawn(store, "probe", 12)
    runner = Runner(store, Registry(probe), RunnerOptions(concurrency=3, **FAST))
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    assert await states(store, ids) == [DONE] * 12
    assert probe.most == 3


async def test_rule_2_a_last_commit_claims_the_next_task_into_its_own_slot(store):
    probe = Probe(hold=0)
    ids = await spawn(store, "probe", 6)
    runner = Runner(store, Registry(probe), RunnerOptions(concurrency=1, **FAST))
    claims = 0
    claim = store.claim

    async def counted(c):
        nonlocal claims
        claims += 1
        return await claim(c)

    store.claim = counted
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    assert await states(store, ids) == [DONE] * 6
    # One asyncio task ran them all, one after another: each claimed by the last commit
    # of the one before, not by the claim loop.
    assert len({probe.jobs[i] for i in ids}) == 1
    assert claims <= 3


async def test_rule_3_nothing_is_claimed_while_stopping(store):
    runner = None

    async def stop(ctx):
        runner.stop()

    probe = Probe(hold=0, on_step=stop)
    first, second = await spawn(store, "probe", 2)
    runner = Runner(store, Registry(probe), RunnerOptions(concurrency=1, **FAST))
    commit, claims = store.commit, []

    async def noted(writes, *a, **kw):
        claims.append(kw.get("then_claim"))
        return await commit(writes, *a, **kw)

    store.commit = noted
    await asyncio.wait_for(runner.run(), 30)
    # The first ran its phase to the end; its last commit claimed nothing for its slot.
    assert await states(store, [first, second]) == [DONE, PENDING]
    assert second not in probe.runs and claims == [None]


class Unsafe(Effect):
    policy = Policy.UNSAFE

    def __init__(self, kind: str, seen: dict, reconciles: bool):
        self.kind, self.seen, self.reconciles = kind, seen, reconciles

    async def perform(self, ctx):
        return {"ok": True}

    def can_reconcile(self, ctx):
        return self.reconciles


class Looking(Unsafe):
    async def reconcile(self, ctx):
        return False, None


async def test_rule_4_intents_ride_on_claims_and_on_a_last_commit_only_those_that_reconcile(
        store):
    seen: dict[str, str] = {}
    blind = Unsafe("blind", seen, False)
    looking = Looking("looking", seen, True)
    w = Writes()
    ids = [w.spawn("blind", {}), w.spawn("looking", {}), w.spawn("blind", {})]
    await store.commit(w)
    runner = Runner(store, Registry(blind, looking), RunnerOptions(concurrency=1, **FAST))
    drive = runner.driver.drive

    async def noted(ctx, slot=None):
        seen[ctx.task.id] = ctx.task.phase  # as claimed: "effect" if its intent rode
        return await drive(ctx, slot)

    runner.driver.drive = noted
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    assert await states(store, ids) == [DONE] * 3
    # The claim loop's claim wrote the first one's intent; the last commits that claimed
    # the others wrote only the reconciling one's.
    assert [seen[i] for i in ids] == ["effect", "effect", ""]


async def die_holding(store, task_ids, deaths: int) -> None:
    """Each task was running when `deaths` lives of the process died."""
    for _ in range(deaths):
        claimed = await store.claim_tasks("dead:1:x", len(task_ids), 30)
        assert {t.id for t in claimed} == set(task_ids)
        await store.recover_tasks(steal_all=True, registered_kinds=["probe"])


async def test_rule_5_a_suspect_runs_alone(store):
    probe = Probe(hold=0.05)
    suspect, *others = await spawn(store, "probe", 4)
    await die_holding(store, [suspect], 3)
    runner = Runner(store, Registry(probe), RunnerOptions(
        concurrency=4, suspect_crashes=3, suspect_defer_seconds=0, **FAST))
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    assert await states(store, [suspect, *others]) == [DONE] * 4
    assert probe.beside.get(suspect, set()) == set()
    assert probe.most == 3  # the others ran side by side, just not beside it


class ConnectionDoesNotExistError(Exception):
    """Named as asyncpg names a connection lost mid-commit (store/outage.py)."""


async def test_rule_6_a_task_whose_commit_was_cut_off_is_handed_back_untouched(store):
    probe = Probe(hold=0)
    [task_id] = await spawn(store, "probe", 1)
    runner = Runner(store, Registry(probe), RunnerOptions(concurrency=1, **FAST))
    commit, cut = store.commit, []

    async def cut_once(writes, *a, **kw):
        update = writes.task_update
        if update is not None and update.state == DONE and not cut:
            cut.append(update.task_id)
            raise ConnectionDoesNotExistError("connection was closed in the middle of it")
        return await commit(writes, *a, **kw)

    store.commit = cut_once
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    task = await store.get_task(task_id)
    assert cut == [task_id] and task.state == DONE
    assert probe.runs[task_id] == 2  # again from its last committed phase
    assert task.crashes == 0 and task.failure is None  # no death, no try counted


async def test_rule_6_a_commit_cut_off_while_others_are_handed_back_is_handed_back_too(
        store):
    # The faults test (seed 583321, a PostgreSQL restarting under load): a task stranded
    # while the hand-back of others waited for the store was forgotten, still leased to
    # this live worker, and its conversation answered nothing more.
    releasing, first, second = asyncio.Event(), None, None

    async def hold_second(ctx):
        if ctx.task.id == second:
            await releasing.wait()

    probe = Probe(hold=0, on_step=hold_second)
    first, second = await spawn(store, "probe", 2)
    runner = Runner(store, Registry(probe), RunnerOptions(concurrency=2, **FAST))
    commit, release, cut = store.commit, store.release_tasks, []

    async def cut_once_each(writes, *a, **kw):
        update = writes.task_update
        if update is not None and update.state == DONE and update.task_id not in cut:
            cut.append(update.task_id)
            raise ConnectionDoesNotExistError("connection was closed in the middle of it")
        return await commit(writes, *a, **kw)

    async def slow_release(owner, ids):
        if second not in cut:  # the first hand-back: the second is cut off meanwhile
            releasing.set()
            await asyncio.wait([probe.jobs[second]])  # its slot, ended with its cut commit
        return await release(owner, ids)

    store.commit, store.release_tasks = cut_once_each, slow_release
    await asyncio.wait_for(runner.run(until_idle=True, horizon=1.0), 30)
    assert cut == [first, second]
    assert await states(store, [first, second]) == [DONE, DONE]


async def test_rule_7_a_finished_task_wakes_the_claim_loop_only_if_its_commit_did_not_look(
        store):
    probe = Probe(hold=0)
    ids = await spawn(store, "probe", 8)
    runner = Runner(store, Registry(probe), RunnerOptions(concurrency=2, **FAST))
    wakes = 0
    wake = runner._wake.set

    def counted():
        nonlocal wakes
        wakes += 1
        wake()

    runner._wake.set = counted
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    assert await states(store, ids) == [DONE] * 8
    # Each last commit but the few at the end found the next task itself.
    assert wakes < len(ids) // 2


async def test_rule_8_leases_are_renewed_while_a_phase_runs_longer_than_a_lease(store):
    probe = Probe(hold=1.2)
    [task_id] = await spawn(store, "probe", 1)
    options = RunnerOptions(concurrency=1, **{**FAST, "lease_seconds": 0.6})
    runner = Runner(store, Registry(probe), options)
    started = time.monotonic()
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    assert time.monotonic() - started >= 1.2
    task = await store.get_task(task_id)
    # Its lease ran out twice over during the phase: only renewals let its commit land.
    assert task.state == DONE and probe.runs[task_id] == 1
