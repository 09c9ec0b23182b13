"""The inbound journal when several workers share one PostgreSQL store.

A worker's own file (`journal.py`) is read only by that worker: one that dies after its
ack and never comes back would take the event with it. So with a shared store the raw
event is committed to the store (`AgentPort.journal_put`) before the ack instead, marked
as being taken in by this worker for `takeover_seconds`; when its processing has
committed, the row goes. Every worker sweeps for rows whose time ran out and takes those
events in (processing an event twice is safe: a message's submission is deduplicated
forever). Same interface as `Journal`, called on the ack loop; the store lives on the
agent's loop, so each call crosses over to it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable

from bot.port import AgentPort

from .routing import CHANNEL

log = logging.getLogger(__name__)


class SharedJournal:
    def __init__(self, port: AgentPort, lease: float, taker: str,
                 agent_loop: Callable[[], asyncio.AbstractEventLoop]):
        self.port, self.lease, self.taker = port, lease, taker
        self._agent_loop = agent_loop
        # Puts still on their way to the store, by event id (touched on the ack loop only):
        # a `done` that comes first waits for its put, as a file line is queued before it.
        self._putting: dict[str, concurrent.futures.Future] = {}

    async def open(self) -> list[dict]:
        """What this worker's last life acked and did not finish (the rest of what dead
        workers left comes with the sweeps, `stale`)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            self.port.journal_stale(CHANNEL, lease=self.lease, taker=self.taker, mine=True),
            self._agent_loop()))

    async def append(self, body: dict) -> None:
        """Committed to the store before this returns (and so before the ack)."""
        event_id = body.get("event_id")
        if not event_id:
            return
        put = self._putting[event_id] = asyncio.run_coroutine_threadsafe(
            self.port.journal_put(CHANNEL, event_id, body, self.lease, self.taker),
            self._agent_loop())
        try:
            await asyncio.wrap_future(put)
        finally:
            if self._putting.get(event_id) is put:
                del self._putting[event_id]

    def done(self, event_id: str) -> None:
        put = self._putting.get(event_id)
        asyncio.run_coroutine_threadsafe(self._done(event_id, put), self._agent_loop())

    async def _done(self, event_id: str, put: concurrent.futures.Future | None) -> None:
        try:
            if put is not None:  # the row must be there before it can go
                await asyncio.wrap_future(put)
            await self.port.journal_done(CHANNEL, [event_id])
        except Exception as exc:  # it stays; a sweep takes it in again, harmlessly
            log.warning("slack: could not mark event %s taken in: %s", event_id, exc)

    async def stale(self) -> list[dict]:
        """On the agent's loop: events whose taker ran out of time, now this worker's."""
        return await self.port.journal_stale(CHANNEL, lease=self.lease, taker=self.taker)

    async def close(self) -> None:
        pass
