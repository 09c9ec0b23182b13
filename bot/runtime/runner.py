"""The task runner's claimer: it leases ready tasks and owns the slots they run in.

`Runner` claims work up to `concurrency` tasks at once; each claimed task runs in a slot (an
asyncio task) that hands it to `PhaseDriver` (bot/runtime/phases.py: what runs one task's
phases and commits their outcomes), and runs the next task the same slot was given. Leases
are renewed in the background; a worker that dies simply stops renewing, and its tasks
become claimable.

The claimer's rules (tests/test_runner_claimer.py has a test named after each):

1. Never more than `concurrency` tasks run here: a claim asks only for the free slots
   (those running, less the ones past their last commit, less those other claims under way
   have reserved).
2. A task's last commit also claims the work that takes its slot, in the same transaction,
   and the first task it claims runs next in that slot: a busy queue costs one transaction
   and no new asyncio task per step. While another last commit is claiming, it claims
   nothing: the claim loop claims for every free slot at once.
3. Nothing is claimed while stopping, while a suspect runs alone, or while a phase's
   commit waits for the store to take it (a refused commit: bot/runtime/phases.py).
4. An intent rides on the claim for the effect kinds that need one whatever the task; on
   a claim that shares a last commit (in doubt if the process dies on that task's way
   out), only those of effects that reconcile (`Registry.intents_at_claim`).
5. A task found holding a lease at `suspect_crashes` deaths (a suspect of killing the
   process) runs alone: what the same claim brought along is handed back, nothing else is
   claimed until its run is over, and the work already in flight finishes before it
   starts. While other work is ready, a suspect is put off for `suspect_defer_seconds`
   from its first death, so what a poison would kill is done first.
6. The store's outage (a database restarting, a full disk: `store.is_unavailable`) is
   nobody's fault: the claim loop waits it out (bot/runtime/supervision.py: logged once
   when it starts and once when it ends) and carries on by itself. A task whose commit was
   cut off with its connection (it may have landed) is stranded: once the store answers
   it is handed back untouched (no death, no try counted) before anything is claimed, and
   runs again from its last committed phase. Any other error of the claim loop ends `run`
   with it, so that the process exits and is started afresh.
7. A finished task wakes the claim loop, unless its last commit already looked for work
   (it filled every free slot, or found no more ready work).
8. Leases are renewed every third of `lease_seconds`; with other workers on the store, the
   running tasks of a worker whose liveness lock was free at two checks in a row are taken
   over at once, except for one `lease_seconds` after this worker had to take its own lock
   again (a restarted server freed every lock; only an expired lease says dead then).
"""

import asyncio
import contextlib
import itertools
import logging
import math
import os
import socket
import time
from dataclasses import dataclass

from bot.runtime.context import TaskContext
from bot.runtime.definitions import Registry
from bot.runtime.phases import PhaseDriver
from bot.runtime.supervision import LoopHealth, describe
from store import (
    Claim,
    LeaseLost,
    Store,
    Task,
    TaskUpdate,
    is_unavailable,
    new_id,
)

log = logging.getLogger(__name__)


class _Slot:
    """One of the runner's `concurrency` places, held by one asyncio task that runs claimed
    tasks one after another: a result commit that claims the task taking its slot hands it
    to this same asyncio task (`next`), so a busy queue spawns no asyncio task, and wakes
    no claim loop, per step."""

    __slots__ = ("task_id", "next", "looked")

    def __init__(self, task_id: str):
        self.task_id = task_id  # the task it runs now
        self.next: tuple[Task, str] | None = None  # (task, claim id) it runs after that
        # Its task's last commit also claimed, and either filled every free slot or found
        # no more ready work: its end leaves no slot for the claim loop to fill (rule 7).
        self.looked = False


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
        self._relocked_at = -math.inf  # when this worker last had to take its lock again
        self.driver = PhaseDriver(store, registry, self.options, self.owner,
                                  end=self._commit_last, stopping=lambda: self._stopping,
                                  wake=self._wake.set)

    @property
    def commits(self) -> LoopHealth:
        """Phases whose commit waits for the store to take it."""
        return self.driver.commits

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
            self._finished(slot.task_id, job, successor=task.id, looked=slot.looked)
            slot.task_id, slot.looked = task.id, False
            job.set_name(f"task:{task.kind}:{task.id}")

    def _slot_done(self, slot: _Slot, job: asyncio.Task) -> None:
        self._finished(slot.task_id, job, looked=slot.looked)
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

    def _finished(self, task_id: str, job: asyncio.Task, *, successor: str | None = None,
                  looked: bool = False) -> None:
        """A task's run here is over; `successor`: the task its job runs next; `looked`:
        its last commit looked for work already (rule 7). A task whose last commit here
        claimed it again (a wait that was over at once) runs on under the same id, in this
        job or another."""
        if self._inflight.get(task_id) is job and task_id != successor:
            del self._inflight[task_id]
        self._ending.discard(job)
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
        # Only those: one still in its slot, or cut off while these were handed back, goes
        # next time (left here, it would stay leased to this live worker for good).
        self._stranded.difference_update(stranded)

    async def _anything_due_soon(self, horizon: float | None) -> bool:
        due = await self.store.next_due()
        horizon = self.options.poll_seconds * 5 if horizon is None else horizon
        return due is not None and due - time.time() <= horizon

    async def _sleep(self, *, busy: bool) -> None:
        timeout = self.options.poll_seconds
        # Work was just claimed, a last commit is claiming for the free slots (`_reserved`),
        # or every slot is busy: what comes next is announced by a finished task or a local
        # commit (`wake`), so wait for that (or a poll) instead of asking the database when
        # the next task is due (at c=64 on SQLite, a read per finished task otherwise).
        if not busy and not self._reserved and len(self._inflight) < self.options.concurrency:
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
                    if await self.store.announce_worker(self.owner):  # after a restart
                        self._relocked_at = time.monotonic()
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
        if time.monotonic() - self._relocked_at < self.options.lease_seconds:
            # This worker just took its own lock again: the server restarted and every
            # worker lost its lock with it, each to take it back at its own next renewal,
            # which a loaded machine may delay. Meanwhile only a lease that runs out says
            # a worker died.
            self._dead_once = set()
            return
        dead = set(await self.store.dead_workers()) - {self.owner}
        confirmed, self._dead_once = dead & self._dead_once, dead
        if confirmed and await self.store.take_over_dead(sorted(confirmed)):
            self.wake()

    # -- a task's run in its slot ------------------------------------------------------

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
            await self.driver.landed(self.store.commit, ctx.writes)
            return
        self._reserved += claim.limit
        self._closing += 1
        try:
            result = await self.driver.landed(self.store.commit, ctx.writes, then_claim=claim)
        finally:
            self._reserved -= claim.limit
            self._closing -= 1
        self._ending.add(asyncio.current_task())  # its slot is the claimed task's now
        admitted = await self._admit(result.claimed, claim, slot) if result.claimed else []
        if slot is not None and not result.duplicate and (
                len(result.claimed) < claim.limit or len(admitted) == claim.limit):
            slot.looked = True

    async def _drive(self, task: Task, claim_id: str, slot: _Slot | None = None) -> None:
        ctx = TaskContext(self.store, task, owner=self.owner, claim=claim_id)
        if self._solo == task.id:  # alone: the work already in flight finishes first
            others = [job for tid, job in self._inflight.items() if tid != task.id]
            if others:
                await asyncio.wait(others)
        try:
            await self.driver.drive(ctx, slot)
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
