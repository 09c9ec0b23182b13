"""Running one task's phases: each phase's outcome committed with the writes it collected.

The claimer (bot/runtime/runner.py) hands a leased task to `PhaseDriver.drive`, which runs
phase after phase, in the same lease, until the task waits, ends or is handed back; the
commit that ends its run here is the claimer's (`end`: it also claims the work that takes
the task's slot).

A try of a phase that raises is a failed attempt: retried with backoff, dead-lettered after
`max_attempts` (an outage's or contention's, after `outage_attempts`, being nobody's fault).
A process that dies is not its tasks' fault either: deaths are counted apart from failures
(`Task.crashes`, reset by every committed phase), and a run of restarts never dead-letters
anything by itself. But a task that has died `crash_limit` times, the first at least
`crash_window_seconds` ago, without committing a phase in between, is a poison: it is
quarantined (its definition's `poisoned` ends it: an agent turn tells the person; others
fail with the reason). So is a task whose checkpoint this build cannot read
(bot/runtime/kinds.py `Refused`: its definition's `refused`).

A phase whose commit the database refused outright (SQLite's full disk, PostgreSQL out of
space: `store.is_refused`, nothing of it landed) keeps its outcome and commits it again until
the store takes it, its effect not repeated (`landed`); meanwhile `commits` says the store is
awaited, and the claimer claims nothing. Any other error of a commit is raised to the
claimer: the task is stranded there.
"""

import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bot.runtime.context import TaskContext
from bot.runtime.definitions import Registry
from bot.runtime.errors import CUT_OFF, FAULT, POISON, NotPerformed, failure_kind
from bot.runtime.killpoints import kill_point
from bot.runtime.kinds import Refused
from bot.runtime.outcomes import Continue, Done, Fail, Interrupted, Outcome, Sleep, Wait
from bot.runtime.supervision import LoopHealth
from store import (
    BLOCKED,
    DONE,
    FAILED,
    INTERRUPTED,
    PENDING,
    RUNNING,
    WAITING,
    LeaseLost,
    Store,
    StoreError,
    Task,
    TaskUpdate,
    Writes,
    is_refused,
)

log = logging.getLogger(__name__)

# The claimer's last commit of a task's run here: (ctx, its update, the slot).
End = Callable[[TaskContext, TaskUpdate, Any], Awaitable[None]]


class PhaseDriver:
    def __init__(self, store: Store, registry: Registry, options: Any, owner: str, *,
                 end: End, stopping: Callable[[], bool], wake: Callable[[], None]):
        self.store = store
        self.registry = registry
        self.options = options  # RunnerOptions
        self.owner = owner
        self._end = end
        self._stopping = stopping
        self._wake = wake  # the claim loop's: commits land again after the store's outage
        self.commits = LoopHealth("runner commits")  # phases whose commit waits to land

    async def commit(self, ctx: TaskContext, update: TaskUpdate) -> None:
        ctx.writes.update_task(update)
        await self.landed(self.store.commit, ctx.writes)

    async def landed(self, commit, *args, **kw):
        """`await commit(*args, **kw)`, again and again while the store refuses it outright
        (nothing of it landed: the same writes are sent again once it has room). An
        outage that leaves the outcome unknown is raised: the task is stranded."""
        while True:
            try:
                result = await commit(*args, **kw)
            except Exception as exc:
                if not is_refused(exc) or self._stopping():
                    raise
                await self.commits.wait_out(exc)
                continue
            if self.commits.waiting:
                self.commits.progressed()
                self._wake()  # claims were held back meanwhile
            return result

    def update(self, ctx: TaskContext, state: str, **kw) -> TaskUpdate:
        kw.setdefault("phase", ctx.phase)
        kw.setdefault("checkpoint", ctx.checkpoint)
        kw.setdefault("attempts", 0)
        return TaskUpdate(ctx.task.id, self.owner, state, **kw)

    async def drive(self, ctx: TaskContext, slot: Any = None) -> None:
        """Run the task's phases until it waits, ends, fails a try or is handed back;
        `slot`: the claimer's, passed to its last commit (`end`)."""
        task = ctx.task
        definition = self.registry.get(task.kind)
        if definition is None:
            log.error("task %s: no definition for kind %r; blocked", task.id, task.kind)
            await self.commit(ctx, self.update(
                ctx, BLOCKED, error=f"no definition registered for task kind {task.kind!r}"))
            return
        if self._poisonous(task):
            reason = (f"quarantined: the process died {task.crashes} times while running "
                      f"it, over {time.time() - task.crashed_since:.0f} s")
            await self._quarantine(ctx, definition.poisoned, reason)
            return
        attempt = task.attempts + 1  # tries of the current phase, this one included
        # Its intent rode on the claim (store.writes.Claim): the claim was the intent commit.
        rode = task.phase == "effect" and task.checkpoint == {"claim": ctx.claim}
        if rode:
            kill_point("after-intent", task.kind)
        while True:
            if self._stopping():
                # Between phases: hand the task back untouched; it resumes from here (one
                # that has not run a step since its intent rode on the claim, from the start).
                if rode:
                    ctx.phase, ctx.checkpoint = "", None
                await self.commit(ctx, self.update(ctx, PENDING, attempts=0))
                return
            ctx.writes = Writes()  # each phase starts with nothing to write
            kill_point("in-phase", f"{task.kind}.{ctx.phase}")
            try:
                outcome = await definition.step(ctx)
            except LeaseLost:
                raise
            except Refused as exc:  # a checkpoint this build cannot read (bot/runtime/kinds.py)
                ctx.writes = Writes()
                await self._quarantine(ctx, definition.refused, f"quarantined: {exc}")
                return
            except Exception as exc:
                await self._failed_attempt(ctx, exc, attempt)
                return
            rode = False
            try:
                if isinstance(outcome, Continue):
                    await self.commit(ctx, self._outcome_update(ctx, outcome))
                else:
                    await self._end(ctx, self._outcome_update(ctx, outcome), slot)
            except LeaseLost:
                raise
            except StoreError as exc:  # the phase wrote something the store refuses
                await self._failed_attempt(ctx, exc, attempt)
                return
            attempt = 1
            if isinstance(outcome, Continue | Wait | Sleep):
                kill_point("after-phase", f"{task.kind}.{outcome.phase}")
            if isinstance(outcome, Continue):
                ctx.phase, ctx.checkpoint = outcome.phase, outcome.checkpoint
                if outcome.phase == "effect":
                    kill_point("after-intent", task.kind)
                continue
            if not isinstance(outcome, Wait | Sleep):
                kill_point("after-result", task.kind)
            return

    async def _quarantine(self, ctx: TaskContext, end, reason: str) -> None:
        """End the task the way its definition says (`end`: its `poisoned` or `refused`),
        never running its phases again; failed, it counts as a poison."""
        log.error("task %s (%s) %s", ctx.task.id, ctx.task.kind, reason)
        update = self._outcome_update(ctx, await end(ctx, reason))
        if update.state == FAILED:
            update = dataclasses.replace(update, failure=POISON)
        await self.commit(ctx, update)

    def _outcome_update(self, ctx: TaskContext, outcome: Outcome) -> TaskUpdate:
        match outcome:
            case Continue(phase, checkpoint):
                # The next phase starts now, in this claim: no try of it has failed yet.
                return self.update(ctx, RUNNING, phase=phase, checkpoint=checkpoint)
            case Wait(phase, checkpoint, mode):
                return self.update(ctx, WAITING, phase=phase, checkpoint=checkpoint,
                                    wait_mode=mode)
            case Sleep(seconds, phase, checkpoint, until_settled):
                return self.update(ctx, PENDING, phase=phase, checkpoint=checkpoint,
                                    run_after=time.time() + seconds,
                                    wake_if_settled=list(until_settled))
            case Done(result, inputs):
                return self.update(ctx, DONE, result=result, inputs=inputs)
            case Fail(error, result):
                return self.update(ctx, FAILED, error=error, result=result, failure=FAULT)
            case Interrupted(result):
                return self.update(ctx, INTERRUPTED, result=result, failure=CUT_OFF,
                                    error="interrupted: the effect was cut off and is unsafe "
                                    "to repeat")
        raise TypeError(f"task step returned {outcome!r}, not an outcome")

    def _poisonous(self, task: Task) -> bool:
        o = self.options
        return (task.crashes >= o.crash_limit and task.crashed_since is not None
                and time.time() - task.crashed_since >= o.crash_window_seconds)

    async def _failed_attempt(self, ctx: TaskContext, exc: Exception, attempt: int) -> None:
        task = ctx.task
        error = f"{type(exc).__name__}: {exc}"
        kind = failure_kind(exc)  # bot/runtime/errors.py
        log.warning("task %s (%s) attempt %d failed: %s", task.id, task.kind, attempt,
                    error, exc_info=kind == FAULT)
        checkpoint = ctx.checkpoint
        if isinstance(exc, NotPerformed):  # certainly nothing happened: no reconciling later
            checkpoint = {**(checkpoint or {}), "not_performed": True}
        # An outage (Unavailable: the checkpoint keeps the doubt) or contention (lost a race
        # to an edit that landed, bounded by how many edits there are) is no fault of the
        # task's: as many tries as an outage.
        limit = self.options.max_attempts if kind == FAULT else self.options.outage_attempts
        ctx.writes = Writes()  # the failed phase's writes are dropped
        if attempt >= limit:
            await self.commit(ctx, self.update(
                ctx, FAILED, checkpoint=checkpoint, failure=kind,
                error=f"dead-lettered after {attempt} attempts; last error: {error}"))
            return
        delay = min(self.options.retry_max_seconds,
                    self.options.retry_base_seconds * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.0)
        await self.commit(ctx, self.update(ctx, PENDING, checkpoint=checkpoint, error=error,
                                             failure=kind, run_after=time.time() + delay,
                                             attempts=attempt))
