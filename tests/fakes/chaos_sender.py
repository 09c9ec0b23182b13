"""Slack's side of the Events API for the chaos test: signed deliveries over HTTP to a
`steward run` that keeps dying.

As Slack does, an event that is not acknowledged (connection refused because Steward is
dead, a timeout, any status but 200) is sent again with `X-Slack-Retry-Num` 1, 2, 3, ...
(`X-Slack-Retry-Reason: http_timeout`), here until it is acknowledged; and some events
that were acknowledged are sent again later all the same (Slack retries after a slow ack).
Events are held in a small buffer and picked from it at random, some are sent late, and
several deliveries are in flight at once, so they arrive out of order: a thread reply's
event may come before the event of the message that started the thread.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from tests.fakes.slack_events import deliver


@dataclass
class Delivery:
    event_id: str
    attempts: list[tuple[int | None, str]] = field(default_factory=list)  # (retry n, outcome)
    acks: int = 0
    first_ack: float | None = None


class SlackSender:
    def __init__(self, url: str, rng: random.Random, *, on_ack: Callable[[], None],
                 redeliver: float = 0.2, late: float = 0.15, hold: int = 3,
                 inflight: int = 4, timeout: float = 3.0):
        self.url = url
        self.rng = rng
        self.on_ack = on_ack
        self.redeliver = redeliver
        self.late = late
        self.hold = hold
        self.timeout = timeout
        self.deliveries: dict[str, Delivery] = {}
        self._queue: list[dict] = []
        self._tasks: set[asyncio.Task] = set()
        self._slots = asyncio.Semaphore(inflight)
        self._closed = False
        self._http: httpx.AsyncClient | None = None

    def put(self, body: dict) -> None:
        self.deliveries.setdefault(body["event_id"], Delivery(body["event_id"]))
        self._queue.append(body)

    def close(self) -> None:
        """No more events will be put; `run` returns once every one is acknowledged."""
        self._closed = True

    @property
    def drained(self) -> bool:
        return not self._queue and not self._tasks

    @property
    def retries(self) -> int:
        return sum(len(d.attempts) - 1 for d in self.deliveries.values())

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=self.timeout) as http:
            self._http = http
            while not (self._closed and self.drained):
                if not self._queue:
                    await asyncio.sleep(0.02)
                    continue
                # Hold a few events back (up to a short while) and pick one at random.
                want = self.rng.randint(1, self.hold)
                until = time.monotonic() + self.rng.uniform(0.05, 0.6)
                while len(self._queue) < want and time.monotonic() < until \
                        and not self._closed:  # noqa: ASYNC110 - a deadline, not an event
                    await asyncio.sleep(0.02)
                body = self._queue.pop(self.rng.randrange(len(self._queue)))
                await self._slots.acquire()
                self._spawn(self._deliver(body, first_retry=0, slot=True))
            self._http = None

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _deliver(self, body: dict, *, first_retry: int, slot: bool) -> None:
        record = self.deliveries[body["event_id"]]
        if slot and self.rng.random() < self.late:
            # Late: Slack had trouble on its side; the events after it overtake it.
            self._slots.release()
            slot = False
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
        try:
            if not slot:
                await self._slots.acquire()
            retry = first_retry
            while True:
                assert self._http is not None
                try:
                    status, _ = await deliver(self._http, self.url, body,
                                              retry_num=retry or None)
                    outcome = str(status)
                except httpx.HTTPError as exc:
                    status, outcome = None, type(exc).__name__
                record.attempts.append((retry or None, outcome))
                if status == 200:
                    break
                retry += 1
                await asyncio.sleep(self.rng.uniform(0.1, 0.6))
            record.acks += 1
            record.first_ack = record.first_ack or time.monotonic()
            self.on_ack()
        finally:
            self._slots.release()
        if first_retry == 0 and self.rng.random() < self.redeliver:
            # Slack sends it again although it was acknowledged (it thought the ack late).
            await asyncio.sleep(self.rng.uniform(0.3, 8.0))
            self._spawn(self._deliver(body, first_retry=retry + 1, slot=False))
