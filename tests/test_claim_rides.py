"""What rides on what in the task queue, on both backends: a result commit that also claims
the task taking its slot (one SQLite transaction for both), an unsafe effect's intent
written by its claim, and the claims a runner working through a queue makes."""

import asyncio

from sqlalchemy import update

from bot.runtime import Done, Effect, Policy, Registry, Runner, RunnerOptions
from store import DONE, PENDING, RUNNING, Claim, LeaseLost, TaskUpdate, Writes, new_id
from store.schema import tasks

ONE = RunnerOptions(concurrency=1, lease_seconds=5, poll_seconds=0.02)


async def _spawn(store, *kinds: str) -> list[str]:
    w = Writes()
    ids = [w.spawn(kind, {"n": n}) for n, kind in enumerate(kinds)]
    await store.commit(w)
    return ids


def _transactions(store) -> int:
    return store._writer.transactions if store._writer is not None else 0


def _done(task_id: str, owner: str) -> Writes:
    w = Writes()
    w.update_task(TaskUpdate(task_id, owner, DONE, "", result={"ok": True}))
    return w


async def test_a_result_commit_claims_the_task_that_takes_its_slot(store):
    first, second = await _spawn(store, "q", "q")
    [claimed] = await store.claim_tasks("me", 1, 30)
    assert claimed.id == first
    before = _transactions(store)
    result = await store.commit(_done(first, "me"), then_claim=Claim("me", 1, 30))
    assert [t.id for t in result.claimed] == [second]
    assert result.claimed[0].state == RUNNING
    if store.dialect == "sqlite":
        assert _transactions(store) == before + 1  # the result and the claim: one fsync
    assert (await store.get_task(first)).state == DONE
    assert (await store.get_task(second)).lease_owner == "me"


async def test_a_step_that_is_not_applied_claims_nothing(store):
    first, second = await _spawn(store, "q", "q")
    await store.claim_tasks("me", 1, 30)
    async with store.engines.write.begin() as conn:  # another worker took it over
        await conn.execute(update(tasks).where(tasks.c.id == first).values(lease_owner="w2"))
    try:
        await store.commit(_done(first, "me"), then_claim=Claim("me", 1, 30))
    except LeaseLost:
        pass
    else:
        raise AssertionError("a commit without the lease went through")
    assert (await store.get_task(second)).state == PENDING


async def test_an_intent_rides_on_the_claim_and_goes_back_with_a_release(store):
    fresh, other, begun, suspect = await _spawn(store, "u", "s", "u", "u")
    async with store.engines.write.begin() as conn:
        # One already past its first phase; one that died twice under a lease nobody holds.
        await conn.execute(update(tasks).where(tasks.c.id == begun).values(
            phase="effect", checkpoint='{"claim":"old"}'))
        await conn.execute(update(tasks).where(tasks.c.id == suspect).values(
            state=RUNNING, lease_owner="dead", lease_expires=0.0, crashes=2))
    claim = Claim("me", 8, 30, claim_id=new_id(), intent_kinds=("u",), ride_below=3)
    got = {t.id: t for t in await store.claim(claim)}
    assert set(got) == {fresh, other, begun, suspect}
    assert (got[fresh].phase, got[fresh].checkpoint) == ("effect", {"claim": claim.claim_id})
    assert (got[other].phase, got[other].checkpoint) == ("", None)  # not a riding kind
    assert got[begun].checkpoint == {"claim": "old"}  # its intent stands as it was
    assert (got[suspect].phase, got[suspect].crashes) == ("", 3)  # may be handed back
    assert await store.release_tasks("me", list(got), claim=claim) == 4
    back = await store.get_task(fresh)
    assert (back.state, back.phase, back.checkpoint) == (PENDING, "", None)
    assert (await store.get_task(begun)).checkpoint == {"claim": "old"}


class Counted(Effect):
    def __init__(self, kind: str, policy: Policy):
        self.kind, self.policy = kind, policy
        self.runs: list[str] = []

    async def perform(self, ctx):
        self.runs.append(ctx.task.id)
        return {"n": ctx.inputs["n"]}


class Reconciling(Counted):
    async def reconcile(self, ctx):
        return False, None


async def _work_through(store, *defs, options=ONE):
    runner = Runner(store, Registry(*defs), options)
    await runner.recover(steal_all=True)
    before = _transactions(store)
    await asyncio.wait_for(runner.run(until_idle=True), 60)
    return _transactions(store) - before


async def test_a_queue_worked_one_at_a_time_costs_one_transaction_a_step(store):
    safe = Counted("safe", Policy.SAFE)
    ids = await _spawn(store, *["safe"] * 30)
    spent = await _work_through(store, safe)
    assert sorted(safe.runs) == sorted(ids)
    assert await store.count_tasks() == {DONE: 30}
    if store.dialect == "sqlite":
        # The first claim, then each result with the next claim (and a last look or two
        # that finds the queue empty): not a claim and a result apiece (60).
        assert spent <= 30 + 3, spent


async def test_an_unsafe_effect_costs_its_claim_and_its_result(store):
    unsafe = Counted("unsafe", Policy.UNSAFE)
    [task_id] = await _spawn(store, "unsafe")
    spent = await _work_through(store, unsafe)
    assert unsafe.runs == [task_id]
    task = await store.get_task(task_id)
    assert (task.state, task.result) == (DONE, {"n": 0})
    if store.dialect == "sqlite":
        assert spent <= 2 + 1, spent  # no intent commit of its own (was 3 and a look)


def test_only_effects_that_reconcile_ride_on_a_claim_another_task_commits():
    registry = Registry(Counted("s", Policy.SAFE), Counted("u", Policy.UNSAFE),
                        Counted("k", Policy.KEYED), Reconciling("r", Policy.UNSAFE))
    assert registry.intents_at_claim() == ("k", "r", "u")
    assert registry.intents_at_claim(reconciling=True) == ("r",)


async def test_a_riding_intent_handed_back_with_a_suspect_is_taken_back(store):
    """A suspect of killing the process runs alone and hands back what its claim brought
    along: an intent that rode on that claim must go back with it, or the effect that never
    started would be reported cut off."""
    unsafe = Counted("unsafe", Policy.UNSAFE)
    fresh, suspect = await _spawn(store, "unsafe", "unsafe")
    async with store.engines.write.begin() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == suspect).values(
            state=RUNNING, lease_owner="dead", lease_expires=0.0, crashes=2,
            crashed_since=0.0))
    options = RunnerOptions(concurrency=4, lease_seconds=5, poll_seconds=0.02,
                            suspect_crashes=3, suspect_defer_seconds=0.0)
    await _work_through(store, unsafe, options=options)
    assert sorted(unsafe.runs) == sorted([fresh, suspect])
    for task_id in (fresh, suspect):
        task = await store.get_task(task_id)
        assert (task.state, task.result) == (DONE, {"n": 0 if task_id == fresh else 1})


async def test_the_next_task_claimed_by_a_result_runs_even_when_it_is_the_same(store):
    """A wait that is over at once is claimed again by its own commit and runs on."""

    class Hop(Effect):
        kind, policy = "hop", Policy.SAFE

        async def perform(self, ctx):
            return "hopped"

    from bot.runtime import TaskDef, Wait

    class Gather(TaskDef):
        kind = "gather"

        async def step(self, ctx):
            if ctx.phase == "":
                return Wait("end", None)
            return Done("gathered")

    [task_id] = await _spawn(store, "gather")
    await _work_through(store, Gather(), Hop())
    assert (await store.get_task(task_id)).result == "gathered"


async def test_of_tasks_ending_together_one_claims_for_the_free_slots(store):
    """Eight tasks that end at the same moment: one result commit carries a claim at a time,
    the others leave their slots to the claim loop, which claims for all of them at once
    (a claim per ending task was one claim statement per step on SQLite's one writer)."""
    release = asyncio.Event()

    class Together(Counted):
        async def perform(self, ctx):
            self.runs.append(ctx.task.id)
            if len(self.runs) % 8 == 0:
                release.set()
            await release.wait()
            return {"n": ctx.inputs["n"]}

    together = Together("together", Policy.SAFE)
    ids = await _spawn(store, *["together"] * 32)
    riding, most, claims = 0, 0, 0
    commit, claim = store.commit, store.claim

    async def counted_commit(writes, *, then_claim=None):
        nonlocal riding, most
        if then_claim is None:
            return await commit(writes)
        riding += 1
        most = max(most, riding)
        try:
            return await commit(writes, then_claim=then_claim)
        finally:
            riding -= 1

    async def counted_claim(c):
        nonlocal claims
        claims += 1
        return await claim(c)

    store.commit, store.claim = counted_commit, counted_claim
    try:
        await _work_through(store, together, options=RunnerOptions(
            concurrency=8, lease_seconds=5, poll_seconds=0.02))
    finally:
        store.commit, store.claim = commit, claim
    assert sorted(together.runs) == sorted(ids)  # each once
    assert await store.count_tasks() == {DONE: 32}
    assert most == 1
    assert claims < 32, claims  # not one for each task that ended
