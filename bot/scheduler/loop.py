"""The scheduler: keeps time for the schedules in the store (their source of truth).

Each pass fires every due schedule once: one commit advances the schedule (compare-and-
set on the occurrence it expected), appends the occurrence's message and spawns the turn
that answers it, whose dedupe key is the schedule id plus the fire time. A restart, a
second worker or a repeated pass therefore cannot fire an occurrence twice. Occurrences
missed while Steward was down are caught up by the schedule's policy: `latest` (default:
the newest one, once, marked late), `all` (each, oldest first, at most MAX_CATCHUP), or
`skip`. A pass the store's outage cut short is waited out and done again when the store is
back (bot/runtime/supervision.py); its occurrences are keyed, so none fires twice.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from bot.agent.deps import AgentDeps
from bot.agent.inbox import TURN
from bot.provenance import marked
from bot.runtime.killpoints import kill_point
from bot.runtime.supervision import LoopHealth
from bot.scheduler.triggers import (
    TriggerError,
    from_ts,
    latest_due,
    make_trigger,
    next_fire,
)
from store import Schedule, ScheduleAdvance, Writes

log = logging.getLogger(__name__)

LATE_AFTER = 60.0  # seconds after its time an occurrence counts as late
MAX_CATCHUP = 10
MAX_SLEEP = 5.0  # re-read the store at least this often (schedules change elsewhere)


class Scheduler:
    def __init__(self, deps: AgentDeps, *, clock: Callable[[], float] = time.time,
                 health: LoopHealth | None = None):
        self.deps = deps
        self.clock = clock
        self.health = health or LoopHealth("scheduler")
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Fire schedules until `stop()`. With several workers on one store only the one
        that leads the job fires them (store/leader.py); the others stand by and take over
        when it dies. Firing twice could not start an occurrence twice (its turn is keyed),
        but one loop is the cheaper and the clearer."""
        store = self.deps.store
        if store.single_node:
            return await self._fire_until_stopped()
        async with store.leader("scheduler") as leader:
            while await leader.acquire(self._stop):
                await self._fire_until_stopped(leader.lost)

    async def _fire_until_stopped(self, lost: asyncio.Event | None = None) -> None:
        while not self._stop.is_set() and not (lost is not None and lost.is_set()):
            try:
                await self.fire_due()
                nxt = await self.deps.store.next_schedule_time()
            except Exception as exc:
                await self.health.wait_out(exc, self._stop)  # raises all but outages
                continue
            self.health.progressed()
            delay = MAX_SLEEP if nxt is None else min(MAX_SLEEP, max(0.0, nxt - self.clock()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    async def fire_due(self) -> int:
        """Fire what is due now; returns how many occurrences started."""
        fired = 0
        for schedule in await self.deps.store.due_schedules(self.clock()):
            try:
                fired += await self._fire(schedule)
            except TriggerError as exc:
                log.error("schedule %s (%s) is broken: %s", schedule.id, schedule.name, exc)
                await self._retire(schedule, "failed")
        if fired:
            self.deps.wake()
        return fired

    async def _retire(self, s: Schedule, state: str) -> None:
        w = Writes()
        w.advance_schedule(ScheduleAdvance(s.id, s.next_fire_at, None, self.clock(), state))
        await self.deps.store.commit(w)

    async def _fire(self, s: Schedule) -> int:
        now = from_ts(self.clock(), s.timezone)
        due = from_ts(s.next_fire_at, s.timezone)
        trigger = make_trigger(s.trigger, s.timezone, created=from_ts(s.created_at, s.timezone))
        occurrence, count = latest_due(trigger, due, now)
        missed = count - 1
        if s.catchup == "all" and count <= MAX_CATCHUP:
            occurrence, missed = due, 0  # oldest first; the next pass fires the next one
        following = next_fire(trigger, occurrence, previous=occurrence)
        late = (now - occurrence).total_seconds() > LATE_AFTER
        w = Writes()
        w.advance_schedule(ScheduleAdvance(
            s.id, s.next_fire_at, None if following is None else following.timestamp(),
            occurrence.timestamp(), "active" if following is not None else "done"))
        starts = not (s.catchup == "skip" and late)
        if starts:
            await self._occurrence(w, s, occurrence, late=late, missed=missed)
        kill_point("before-fire", "scheduler")
        if (await self.deps.store.commit(w)).duplicate:
            return 0  # another worker (or an earlier pass) fired it
        kill_point("after-fire", "scheduler")
        return int(starts)

    async def _occurrence(self, w: Writes, s: Schedule, occurrence, *, late: bool,
                          missed: int) -> None:
        store = self.deps.store
        if s.conversation_id is not None:
            conversation_id = s.conversation_id
        else:
            conversation_id = (await store.ensure_conversation(f"schedule:{s.id}",
                                                               owner=s.owner)).id
        stamp = occurrence.strftime("%a %d %b %Y %H:%M %Z")
        note = f"[Scheduled: {s.name} — due {stamp}"
        if late:
            note += "; it is late: Steward was not running then, say so"
            if missed:
                note += f" ({missed} earlier occurrence(s) were skipped)"
        text = f"{note}]\n{s.prompt}"
        key = f"occurrence:{s.id}:{occurrence.isoformat()}"
        turn = w.spawn(TURN, {"channel": s.deliver.get("channel", "cli"),
                              "reply_to": s.deliver.get("reply_to", {}),
                              "schedule": s.id, "occurrence": occurrence.isoformat()},
                       conversation_id=conversation_id, dedupe_key=key)
        # Made from outside text: its words are that text's, never the person's own.
        mark = marked(s.origin and f"a reminder made from {s.origin}")
        w.append(conversation_id, "user", text, author="scheduler", ref=key, task_id=turn,
                 data={"schedule": s.id, "occurrence": occurrence.isoformat(), "late": late,
                       "missed": missed, **mark})
