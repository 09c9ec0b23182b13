"""The kind of a task's failure is stored with it (`Task.failure`, migration 0011), as the
runner decided it (bot/runtime/errors.py), not left to be read back from the error's
text: an outage, contention, a fault, interrupted; cleared once a phase succeeds. Both
backends, the real runner."""

import asyncio
import dataclasses

from sqlalchemy import update

from bot.runtime import (
    Effect,
    Fail,
    NotPerformed,
    Policy,
    Registry,
    Runner,
    TaskDef,
    Unavailable,
)
from bot.runtime.errors import failure_kind
from store import DONE, FAILED, INTERRUPTED, PENDING
from store.errors import DocumentConflict
from store.schema import tasks
from tests.test_runtime import FAST, run_all, spawn


class Failing(Effect):
    """Raises `ctx.inputs["raise"]` the first `ctx.inputs["times"]` tries, then succeeds."""

    kind = "failing"
    policy = Policy.SAFE
    errors = {"outage": NotPerformed("the service is down"),
              "doubt": Unavailable("the connection dropped"),
              "contention": DocumentConflict("todo", "list", 3, 4),
              "fault": ValueError("a bug")}

    def __init__(self):
        self.tries: dict[str, int] = {}

    async def perform(self, ctx):
        n = self.tries[ctx.task.id] = self.tries.get(ctx.task.id, 0) + 1
        if n <= ctx.inputs["times"]:
            raise self.errors[ctx.inputs["raise"]]
        return "ok"


class Gives(TaskDef):
    kind = "gives_up"

    async def step(self, ctx):
        return Fail("not today")


class CutOff(Effect):
    kind = "cut_off"
    policy = Policy.UNSAFE

    async def perform(self, ctx):
        raise AssertionError("never performed: the intent was committed by a dead process")


async def test_a_dead_letter_says_what_kind_of_failure_it_was(store):
    ids = {what: await spawn(store, "failing", {"raise": what, "times": 99})
           for what in ("outage", "doubt", "contention", "fault")}
    await run_all(store, Failing())
    found = {what: await store.get_task(i) for what, i in ids.items()}
    assert {w: (t.state, t.failure) for w, t in found.items()} == {
        "outage": (FAILED, "outage"), "doubt": (FAILED, "outage"),
        "contention": (FAILED, "contention"), "fault": (FAILED, "fault")}
    # an outage and contention get `outage_attempts` tries, a fault `max_attempts`
    assert found["outage"].error.startswith(f"dead-lettered after {FAST.outage_attempts} ")
    assert found["fault"].error.startswith(f"dead-lettered after {FAST.max_attempts} ")


async def test_the_kind_is_kept_while_waiting_to_retry_and_cleared_by_success(store):
    task_id = await spawn(store, "failing", {"raise": "outage", "times": 1})
    runner = Runner(store, Registry(Failing()), dataclasses.replace(
        FAST, retry_base_seconds=1.0, retry_max_seconds=1.0))
    await runner.recover(steal_all=True)
    job = asyncio.create_task(runner.run())
    for _ in range(500):  # the first try failed: pending, due again in 0.5-1 s
        waiting = await store.get_task(task_id)
        if waiting.attempts == 1:
            break
        await asyncio.sleep(0.01)
    assert (waiting.state, waiting.failure, waiting.error) == (
        PENDING, "outage", "NotPerformed: the service is down")
    for _ in range(500):
        done = await store.get_task(task_id)
        if done.state == DONE:
            break
        await asyncio.sleep(0.01)
    runner.stop()
    await job
    assert (done.state, done.failure, done.error) == (DONE, None, None)


async def test_a_tasks_own_fail_is_a_fault_and_an_interrupted_effect_says_so(store):
    gave_up = await spawn(store, "gives_up", {})
    await run_all(store, Gives())
    assert (await store.get_task(gave_up)).failure == "fault"
    # An unsafe effect whose intent a process that died committed: never repeated.
    cut = await spawn(store, "cut_off", {})
    async with store.engines.write.begin() as conn:
        await conn.execute(update(tasks).where(tasks.c.id == cut).values(
            phase="effect", checkpoint='{"claim": "a dead process"}'))
    await run_all(store, CutOff())
    task = await store.get_task(cut)
    assert (task.state, task.failure) == (INTERRUPTED, "interrupted")


def test_failure_kind_reads_the_exception_tree():
    assert failure_kind(NotPerformed()) == failure_kind(Unavailable()) == "outage"
    assert failure_kind(DocumentConflict("todo", "list", 3, 4)) == "contention"
    assert failure_kind(RuntimeError()) == "fault"
