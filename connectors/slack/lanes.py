"""Ordered work per conversation, in parallel across conversations.

Each conversation key has a lane: items are taken in the order the messages were written
(their Slack ts, which is what a retried or late event is sorted by), one at a time, so a
thread's earlier messages are stored before a later one and follow-ups keep their order.
Lanes exist only while they hold work; a semaphore caps how many run at once.

A handler that returns a number of seconds parks its lane (an outage holds the item: it
is put back in front, and the lane starts again after that pause, the items that came
meanwhile behind it). A parked lane holds no slot and does not count as busy: `join`
does not wait for it, and `close` drops it (its items are journaled).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

Handler = Callable[[Any], Awaitable[float | None]]  # a number: park the lane this long

log = logging.getLogger(__name__)


class Lanes:
    def __init__(self, handler: Handler, concurrency: int = 16):
        self._handler = handler
        self._limit = asyncio.Semaphore(concurrency)
        self._heaps: dict[str, list] = {}
        self._workers: dict[str, asyncio.Task] = {}
        self._parked: dict[str, asyncio.TimerHandle] = {}
        self._counter = itertools.count()
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, key: str, order: Any, item: Any) -> None:
        heapq.heappush(self._heaps.setdefault(key, []), (order, next(self._counter), item))
        if key not in self._parked:
            self._start(key)

    def _start(self, key: str) -> None:
        self._idle.clear()
        if key not in self._workers:
            self._workers[key] = asyncio.create_task(self._run(key), name=f"slack-lane:{key}")

    def _unpark(self, key: str) -> None:
        self._parked.pop(key, None)
        if self._heaps.get(key):
            self._start(key)

    @property
    def busy(self) -> int:
        return sum(len(h) for k, h in self._heaps.items() if k not in self._parked) + len(
            self._workers)

    async def join(self, grace: float | None = None) -> bool:
        """Wait until every lane is empty or parked; False if `grace` seconds passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), grace)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        for timer in self._parked.values():
            timer.cancel()
        self._parked.clear()
        workers = list(self._workers.values())
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)

    async def _run(self, key: str) -> None:
        heap = self._heaps[key]
        try:
            while heap:
                entry = heapq.heappop(heap)
                async with self._limit:
                    try:
                        pause = await self._handler(entry[2])
                    except Exception:  # one bad event must not stop its conversation
                        log.exception("slack: processing an event of %s failed", key)
                        pause = None
                if pause is not None:  # held: back in front, the lane waits
                    heapq.heappush(heap, entry)
                    self._parked[key] = asyncio.get_running_loop().call_later(
                        pause, self._unpark, key)
                    return
        finally:
            self._workers.pop(key, None)
            if not heap:
                self._heaps.pop(key, None)
            if not self._workers:
                self._idle.set()
