"""The task runner: leases ready tasks, runs their phases, commits each outcome.

One loop claims work up to `concurrency`; each claimed task runs in its own asyncio task,
phase after phase, until it waits, ends or is handed back. Leases are renewed in the
background; a worker that dies simply stops renewing, and its tasks become claimable.

A process that dies is not its tasks' fault: deaths are counted apart from failures
(`Task.crashes`, reset by every committed phase), and a run of restarts never dead-letters
anything by itself. But an input that kills the process each time it runs (a poison) must
still end, and must not take the other work in flight with it. So a task found holding a
lease at `suspect_crashes` deaths runs alone (nothing else is claimed until its phase is
over, and what the same claim brought along is handed back); and one that has died
`crash_limit` times, the first at least `crash_window_seconds` ago, without committing a
phase in between, is quarantined: its definition's `poisoned` ends it (an agent turn tells
the person; others fail with the reason).

The store's outage (a database restarting, a full disk: `store.is_unavailable`) is nobody's
fault either. The claim loop waits it out (`bot/runtime/supervision.py`: logged once when it
starts and once when it ends) and carries on by itself. A phase whose commit the database
refused outright (SQLite's full disk, PostgreSQL out of space: `store.is_refused`, nothing
of it landed) keeps its outcome and commits it again until the store takes it, its effect
not repeated; nothing new is claimed meanwhile. A phase whose commit was cut off with its
connection (it may have landed) is *stranded*: once the store answers again it is handed
back untouched (no death, no try counted) before anything is claimed, and runs again from
its last committed phase, as after a crash. Any other error of the claim loop ends `run`
with it, so that the process exits and is started afresh rather than stay up with nothing
claiming its work.
"""

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import random
import socket
import time
from dataclasses import dataclass

from bot.runtime.context import TaskContext
from bot.runtime.definitions import Registry
from bot.runtime.errors import CUT_OFF, FAULT, POISON, NotPerformed, failure_kind
from bot.runtime.killpoints import kill_point
from bot.runtime.kinds import Refused
from bot.runtime.outcomes import Continue, Done, Fail, Interrupted, Outcome, Sleep, Wait
from bot.runtime.supervision import LoopHealth, describe
from store import (
    BLOCKED,
    DONE,
    FAILED,
    INTERRUPTED,
    PENDING,
    RUNNING,
    WAITING,
    Claim,
    LeaseLost,
    Store,
    StoreError,
    Task,
    TaskUpdate,
    Writes,
    is_refused,
    is_unavailable,
    new_id,
)

log = logging.getLogger(__name__)


class _Slot:
    """One of the runner's `concurrency` places, held by one asyncio task that runs claimed
    tasks one after another: a result commit that claims the task taking its slot hands it
    to this same asyncio task (`next`), so a busy queue spawns no asyncio task, and wakes
    no claim loop, per step."""

    __slots__ = ("task_id", "next")

    def __init__(self, task_id: str):
        self.task_id = task_id  # the task it runs now
        self.next: tuple[Task, str] | None = None  # (task, claim id) it runs after that


@dataclass
class RunnerOptions:
    concurrency: int = 8
    lease_seconds: float = 15.0
    max_attempts: int = 5
    # Tries of an effect that keeps reporting `NotPerformed` (its service is down): with the
    # backoff capped at retry_max_seconds, the default rides out outages of several hours.
    outage_attempts: int = 60
    retry_base_seconds: float = 1.0
    retry_max_seconds: float = 300.0
    poll_seconds: float = 1.0
    suspect_crashes: int = 3  # deaths a task was there for before it runs alone
    suspect_defer_seconds: float = 30.0  # other ready work goes before it, this long
    # Deaths, spanning crash_window_seconds, that make it a poison. Generous: SIGKILLed
    # every few seconds for an hour (the chaos test), no innocent task may reach it.
    crash_limit: int = 10
    crash_window_seconds: float = 900.0


class Runner:
    def __init__(self, store: Store, registry: Registry, options: RunnerOptions | None = None,
                 *, owner: str | None = None, health: LoopHealth | None = None):
        self.store = store
        self.health = health or LoopHealth("runner")
        self.registry = registry
        self.options = options or RunnerOptions()
        # host:pid:id: bot/app/lease_holder.py reads whether the holder of a lease lives
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{new_id()}"
        self._inflight: dict[str, asyncio.Task] = {}  # task id -> the job running it
        self._reserved = 0  # slots of claims under way
        self._ending: set[asyncio.Task] = set()  # jobs past their last commit: slots free
        self._closing = 0  # last commits under way (one of them claims for the slots)
        # Tasks whose last commit also claimed, and either filled every free slot or
        # found no more ready work: their end leaves no slot for the claim loop to fill,
        # so it need not wake it.
        self._looked: set[str] = set()
        # Claim ids: unique per lease (a checkpoint naming another claim was left by a
        # worker that died), so this runner's own unique id and a count.
        self._claim_ids = itertools.count(1)
        self._claim_prefix = f"{new_id()}."
        self._intent_kinds = registry.intents_at_claim()
        self._reconciling_kinds = registry.intents_at_claim(reconciling=True)
        self._solo: str | None = None  # a suspect of killing the process, run alone
        self._wake = asyncio.Event()
        self._stopping = False
        self._stranded: set[str] = set()  # leased here, their commit lost to an outage
        self._dead_once: set[str] = set()  # workers whose liveness lock was free last time
        self.commits = LoopHealth("runner commits")  # phases whose commit waits to land

    # -- lifecycle ---------------------------------------------------------------------

    async def recover(self, *, steal_all: bool) -> dict:
        """Resume what a dead process left: call once before running. `steal_all` only when
        this process is known to be the only worker on the store."""
        await self.store.announce_worker(self.owner)
        counts = await self.store.recover_tasks(steal_all=steal_all,
                                                registered_kinds=self.registry.kinds())
        if any(counts.values()):
            log.info("recovered tasks: %s", counts)
        return counts

    def wake(self) -> None:
        """New work was committed locally: look for it now rather than at the next poll."""
        self._wake.set()

    @property
    def waiting_for_store(self) -> bool:
        """Whether the claim loop or a phase's commit is waiting out the store's outage."""
        return self.health.waiting or self.commits.waiting

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Stop claiming; tasks in flight end their current phase and are handed back."""
        self._stopping = True
        self._wake.set()

    async def run(self, *, until_idle: bool = False, horizon: float | None = None) -> None:
        """Run until `stop()` (or, with `until_idle`, until no task is ready or running and
        none is due within `horizon` seconds: a few polls unless given)."""
        # Alive for the other workers before anything is claimed (recover() did it if it
        # ran): a runner without its liveness lock would look dead to them. The store away
        # now, the lease renewer takes the lock when it is back.
        try:
            await self.store.announce_worker(self.owner)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
        renewer = asyncio.create_task(self._renew_leases())
        try:
            while not self._stopping:
                self._wake.clear()
                try:
                    if self._stranded:
                        await self._hand_back_stranded()
                    claimed = await self._claim()
                    if until_idle and not claimed and not self._inflight:
                        if not await self._anything_due_soon(horizon):
                            break
                    await self._sleep(busy=bool(claimed))
                except Exception as exc:
                    await self.health.wait_out(exc, self._wake)  # raises all but outages
                    continue
                self.health.progressed()
        finally:
            if self._inflight:
                await asyncio.gather(*self._inflight.values(), return_exceptions=True)
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    @property
    def busy(self) -> int:
        """How many tasks run here now."""
        return len(self._inflight)

    async def drain(self, grace: float, *, hand_back: bool = False) -> bool:
        """After `stop()`: wait up to `grace` seconds for phases in flight; cancel the rest, which
        stay resumable from their last commit. True if everything finished in time.
        `hand_back`: what was cancelled goes back to pending at once (nothing counted against
        it), instead of staying `running` under a lease nobody renews until the next start
        (a process that stops on purpose is not one that died)."""
        self.stop()
        if not self._inflight:
            return True
        _, pending = await asyncio.wait(list(self._inflight.values()), timeout=grace)
        cut = [task_id for task_id, job in self._inflight.items() if job in pending]
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if hand_back and cut:
            try:
                await self.store.release_tasks(self.owner, cut)
            except Exception as exc:  # then they resume at the next start, as after a crash
                log.warning("could not hand back %d task(s): %s", len(cut), describe(exc))
        return not pending

    # -- claiming ----------------------------------------------------------------------

    def _next_claim(self, *, leaving: int = 0) -> Claim | None:
        """What to claim now, if a slot is free. `leaving`: the task whose last commit this
        claim shares. The intents it carries would be in doubt if the process died on that
        task's way out, so only those of effects that reconcile ride on such a claim."""
        busy = len(self._inflight) - len(self._ending) - leaving
        free = self.options.concurrency - busy - self._reserved
        if free <= 0 or self._solo is not None or self._stopping or self.commits.waiting:
            return None
        return Claim(self.owner, free, self.options.lease_seconds,
                     claim_id=f"{self._claim_prefix}{next(self._claim_ids)}",
                     intent_kinds=self._reconciling_kinds if leaving else self._intent_kinds,
                     ride_below=self.options.suspect_crashes)

    async def _claim(self) -> list[Task]:
        claim = self._next_claim()
        if claim is None:
            return []
        self._reserved += claim.limit
        try:
            claimed = await self.store.claim(claim)
        finally:
            self._reserved -= claim.limit
        return await self._admit(claimed, claim)

    async def _admit(self, claimed: list[Task], claim: Claim,
                     slot: _Slot | None = None) -> list[Task]:
        """Start running what `claim` leased: the first task in `slot` (that of the task
        whose last commit claimed it) once its task is over, the others in jobs of their
        own. A suspect always gets a job of its own (it waits for the others)."""
        claimed = await self._isolate_suspects(claimed, claim)
        for task in claimed:
            if (old := self._inflight.get(task.id)) is not None:  # claimed by its own commit
                self._ending.discard(old)
            if slot is not None and slot.next is None and task.id != self._solo:
                slot.next = (task, claim.claim_id)
                self._inflight[task.id] = asyncio.current_task()
                continue
            self._start(task, claim.claim_id)
        return claimed

    def _start(self, task: Task, claim_id: str) -> None:
        slot = _Slot(task.id)
        job = asyncio.create_task(self._run_slot(slot, task, claim_id),
                                  name=f"task:{task.kind}:{task.id}")
        self._inflight[task.id] = job
        job.add_done_callback(lambda j: self._slot_done(slot, j))

    async def _run_slot(self, slot: _Slot, task: Task, claim_id: str) -> None:
        job = asyncio.current_task()
        while True:
            await self._drive(task, claim_id, slot)
            if slot.next is None:
                return
            (task, claim_id), slot.next = slot.next, None
            self._finished(slot.task_id, job, successor=task.id)
            slot.task_id = task.id
            job.set_name(f"task:{task.kind}:{task.id}")

    def _slot_done(self, slot: _Slot, job: asyncio.Task) -> None:
        self._finished(slot.task_id, job)
        if slot.next is not None:  # handed to the slot, never started (cancelled)
            self._finished(slot.next[0].id, job)

    async def _isolate_suspects(self, claimed: list[Task], claim: Claim) -> list[Task]:
        """Of the tasks just claimed, those that were running when the process died more
        than once (suspects of killing it) run alone, one at a time, the fewest deaths
        first (dying beside a poison makes a task a suspect too). While other work is
        ready it goes first, for up to `suspect_defer_seconds`: if a suspect is a poison,
        what it would kill is done by then. The rest of the claim is handed back."""
        o = self.options
        suspects = sorted((t for t in claimed if t.crashes >= o.suspect_crashes),
                          key=lambda t: (t.crashes, t.id))
        if not suspects:
            return claimed
        others = [t for t in claimed if t.crashes < o.suspect_crashes]
        # From its first death (kept with the task), not from this life's start: restarted
        # every few seconds under load, it would be put off in every life.
        first_death = suspects[0].crashed_since or time.time()
        if others and time.time() - first_death < o.suspect_defer_seconds:
            await self.store.release_tasks(self.owner, [t.id for t in suspects],
                                           run_after=time.time() + o.poll_seconds,
                                           claim=claim)
            return others
        solo = suspects[0]
        await self.store.release_tasks(self.owner, [t.id for t in claimed if t is not solo],
                                       claim=claim)
        log.warning("task %s (%s) was running when %d lives of this process died; running "
                    "it alone", solo.id, solo.kind, solo.crashes)
        self._solo = solo.id
        return [solo]

    def _finished(self, task_id: str, job: asyncio.Task, *,
                  successor: str | None = None) -> None:
        """A task's run here is over; `successor`: the task its job runs next. A task
        whose last commit here claimed it again (a wait that was over at once) runs on
        under the same id, in this job or another."""
        if self._inflight.get(task_id) is job and task_id != successor:
            del self._inflight[task_id]
        self._ending.discard(job)
        looked = task_id in self._looked
        self._looked.discard(task_id)
        if self._solo == task_id:
            self._solo, looked = None, False  # what it held back may be claimed now
        if not looked:
            self._wake.set()

    async def _hand_back_stranded(self) -> None:
        """Tasks whose commit failed (the store's outage, mostly) go back to pending as they
        were last committed (their phase's effect is judged by its replay policy when it
        runs again), before the claim that would count each of them a death."""
        stranded = sorted(self._stranded - set(self._inflight))
        if stranded:
            n = await self.store.release_tasks(self.owner, stranded)
            log.info("handed back %d task(s) whose commit failed", n)
        self._stranded.clear()

    async def _anything_due_soon(self, horizon: float | None) -> bool:
        due = await self.store.next_due()
        horizon = self.options.poll_seconds * 5 if horizon is None else horizon
        return due is not None and due - time.time() <= horizon

    async def _sleep(self, *, busy: bool) -> None:
        timeout = self.options.poll_seconds
        # Work was just claimed, or every slot is busy: what comes next is announced by a
        # finished task or a local commit (`wake`), so wait for that (or a poll) instead
        # of asking the database when the next task is due.
        if not busy and len(self._inflight) < self.options.concurrency:
            due = await self.store.next_due()
            if due is not None:
                timeout = max(0.0, min(timeout, due - time.time()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _renew_leases(self) -> None:
        """Keep this worker's leases; with other workers on the store, take the running
        tasks of any that died at once (its liveness lock is free), not when their
        leases run out."""
        interval = self.options.lease_seconds / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.store.renew_leases(self.owner, list(self._inflight),
                                              self.options.lease_seconds)
                if not self.store.single_node:
                    await self.store.announce_worker(self.owner)  # again after a restart
                    await self._take_over_the_dead()
            except Exception as exc:  # a transient database error must not stop renewals
                if is_unavailable(exc):  # the claim loop says so, once
                    log.debug("lease renewal failed: %s", describe(exc))
                else:
                    log.exception("lease renewal failed")

    async def _take_over_the_dead(self) -> None:
        """Take over the running tasks of workers whose liveness lock was free at two checks
        in a row: a database restart frees every lock at once, and a live worker takes its
        own again at its next renewal, before it would be taken for dead."""
        dead = set(await self.store.dead_workers()) - {self.owner}
        confirmed, self._dead_once = dead & self._dead_once, dead
        if confirmed and await self.store.take_over_dead(sorted(confirmed)):
            self.wake()

    # -- running one task --------------------------------------------------------------

    async def _commit(self, ctx: TaskContext, update: TaskUpdate) -> None:
        ctx.writes.update_task(update)
        await self._landed(self.store.commit, ctx.writes)

    async def _landed(self, commit, *args, **kw):
        """`await commit(*args, **kw)`, again and again while the store refuses it outright
        (nothing of it landed: the same writes are sent again once it has room). An
        outage that leaves the outcome unknown is raised: the task is stranded."""
        while True:
            try:
                result = await commit(*args, **kw)
            except Exception as exc:
                if not is_refused(exc) or self._stopping:
                    raise
                await self.commits.wait_out(exc)
                continue
            if self.commits.waiting:
                self.commits.progressed()
                self._wake.set()  # claims were held back meanwhile
            return result

    async def _commit_last(self, ctx: TaskContext, update: TaskUpdate,
                           slot: _Slot | None = None) -> None:
        """The commit that ends this task's run here: it also claims the task that takes
        its slot, so a busy queue costs one transaction per step, not two, and the first
        task claimed runs next in this task's `slot`."""
        ctx.writes.update_task(update)
        # While another last commit is under way, this one claims nothing: its slot is left
        # to the claim loop, which claims for every free slot at once. Under load a claim
        # per ending task cost the single SQLite writer one claim statement per step
        # (bench/store.py c=64 on SQLite: 3,400-4,200 steps/s with, 5,700-9,300 without).
        claim = None if self._closing else self._next_claim(leaving=1)
        if claim is None:
            await self._landed(self.store.commit, ctx.writes)
            return
        self._reserved += claim.limit
        self._closing += 1
        try:
            result = await self._landed(self.store.commit, ctx.writes, then_claim=claim)
        finally:
            self._reserved -= claim.limit
            self._closing -= 1
        self._ending.add(asyncio.current_task())  # its slot is the claimed task's now
        admitted = await self._admit(result.claimed, claim, slot) if result.claimed else []
        if not result.duplicate and (len(result.claimed) < claim.limit
                                     or len(admitted) == claim.limit):
            self._looked.add(ctx.task.id)

    def _update(self, ctx: TaskContext, state: str, **kw) -> TaskUpdate:
        kw.setdefault("phase", ctx.phase)
        kw.setdefault("checkpoint", ctx.checkpoint)
        kw.setdefault("attempts", 0)
        return TaskUpdate(ctx.task.id, self.owner, state, **kw)

    async def _drive(self, task: Task, claim_id: str, slot: _Slot | None = None) -> None:
        ctx = TaskContext(self.store, task, owner=self.owner, claim=claim_id)
        if self._solo == task.id:  # alone: the work already in flight finishes first
            others = [job for tid, job in self._inflight.items() if tid != task.id]
            if others:
                await asyncio.wait(others)
        try:
            await self._drive_phases(ctx, slot)
        except LeaseLost as exc:
            log.warning("%s", exc)
        except Exception as exc:
            # Handed back by the claim loop (once the store answers): no claim takes over
            # a lease of its own claimer, so left as it is, it would wait for a restart.
            self._stranded.add(task.id)
            if is_unavailable(exc):
                log.info("task %s (%s): its commit waits for the store: %s", task.id,
                         task.kind, describe(exc))
            else:
                log.exception("task %s (%s): could not commit", task.id, task.kind)

    async def _drive_phases(self, ctx: TaskContext, slot: _Slot | None = None) -> None:
        task = ctx.task
        definition = self.registry.get(task.kind)
        if definition is None:
            log.error("task %s: no definition for kind %r; blocked", task.id, task.kind)
            await self._commit(ctx, self._update(
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
            if self._stopping:
                # Between phases: hand the task back untouched; it resumes from here (one
                # that has not run a step since its intent rode on the claim, from the start).
                if rode:
                    ctx.phase, ctx.checkpoint = "", None
                await self._commit(ctx, self._update(ctx, PENDING, attempts=0))
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
                    await self._commit(ctx, self._outcome_update(ctx, outcome))
                else:
                    await self._commit_last(ctx, self._outcome_update(ctx, outcome), slot)
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
        await self._commit(ctx, update)

    def _outcome_update(self, ctx: TaskContext, outcome: Outcome) -> TaskUpdate:
        match outcome:
            case Continue(phase, checkpoint):
                # The next phase starts now, in this claim: no try of it has failed yet.
                return self._update(ctx, RUNNING, phase=phase, checkpoint=checkpoint)
            case Wait(phase, checkpoint, mode):
                return self._update(ctx, WAITING, phase=phase, checkpoint=checkpoint,
                                    wait_mode=mode)
            case Sleep(seconds, phase, checkpoint, until_settled):
                return self._update(ctx, PENDING, phase=phase, checkpoint=checkpoint,
                                    run_after=time.time() + seconds,
                                    wake_if_settled=list(until_settled))
            case Done(result, inputs):
                return self._update(ctx, DONE, result=result, inputs=inputs)
            case Fail(error, result):
                return self._update(ctx, FAILED, error=error, result=result, failure=FAULT)
            case Interrupted(result):
                return self._update(ctx, INTERRUPTED, result=result, failure=CUT_OFF,
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
            await self._commit(ctx, self._update(
                ctx, FAILED, checkpoint=checkpoint, failure=kind,
                error=f"dead-lettered after {attempt} attempts; last error: {error}"))
            return
        delay = min(self.options.retry_max_seconds,
                    self.options.retry_base_seconds * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.0)
        await self._commit(ctx, self._update(ctx, PENDING, checkpoint=checkpoint, error=error,
                                             failure=kind, run_after=time.time() + delay,
                                             attempts=attempt))
