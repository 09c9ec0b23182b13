"""Streaming: the committed partial text of a Slack turn, shown in the answer's message.

The agent commits streamed text about every 100 ms and publishes it as a "partial" event
carrying the turn id, its answer's key, its channel and its reply address. For a turn that
answers in Slack, the first partial posts the answer's message under the delivery's own key
(`<answer>.answer`, in the metadata: bot.agent.inbox.answer_key, or the turn's id); later
ones edit it at most every `stream_update_seconds` (intermediate texts are skipped, and a
429 from Slack simply stretches the interval). The final delivery edits the same message
(`SlackChannel.send` marks the key finished first, so no stream edit lands after it), and
waits out what is left of the interval since the last stream write (`pace`), so the
message is never written more often than that, the final edit included.
After a restart the key finds the same message, so the answer continues in place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from bot.port import Events
from bot.runtime.killpoints import kill_point

from . import faults
from .messages import Messages
from .mrkdwn import render

log = logging.getLogger(__name__)

IDLE_SECONDS = 300.0  # a stream with no new text for this long is dropped (re-made on demand)
REMEMBERED = 5000
TYPING = " …"  # shown at the end while the answer is still being written


@dataclass
class _Stream:
    key: str
    where: dict[str, Any]
    text: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    writing: bool = False
    writes: int = 0
    task: asyncio.Task | None = None


class Streams:
    def __init__(self, events: Events, messages: Messages, *, channel: str,
                 interval: float, allow_broadcast: bool = False):
        self.allow_broadcast = allow_broadcast  # [slack] allow_broadcast_mentions
        self.events = events
        self.messages = messages
        self.channel = channel
        self.interval = interval
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._streams: dict[str, _Stream] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._written: OrderedDict[str, float] = OrderedDict()  # key -> last write (monotonic)

    def start(self) -> None:
        self._queue = self.events.subscribe(None)
        self._task = asyncio.create_task(self._listen(), name="slack-streams")

    async def stop(self) -> None:
        if self._queue is not None:
            self.events.unsubscribe(self._queue)
        tasks = [t for t in [self._task, *(s.task for s in self._streams.values())] if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._streams.clear()

    def finish(self, key: str) -> None:
        """The final answer is being delivered: no stream edit may follow."""
        _bounded_add(self._finished, key)
        stream = self._streams.pop(key, None)
        if stream is not None and stream.task is not None and not stream.writing:
            stream.task.cancel()

    async def pace(self, key: str) -> None:
        """Wait until the last stream write of `key` is `interval` ago (the final edit
        calls it holding the key's lock, so no stream write can come in between)."""
        written = self._written.pop(key, None)
        if written is not None:
            left = written + self.interval - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)

    async def _listen(self) -> None:
        assert self._queue is not None
        while True:
            event = await self._queue.get()
            if event.kind != "partial":
                continue
            try:
                if event.data.get("channel") == self.channel:
                    await self._on_partial(event.data.get("answer") or event.data.get("turn"),
                                           event.data.get("text") or "",
                                           event.data.get("reply_to"))
            except Exception:  # noqa: BLE001 - showing progress must never stop the listener
                log.exception("slack: streaming a partial failed")

    async def _on_partial(self, answer: str | None, text: str, where: dict | None) -> None:
        if not answer or not where or not text.strip():
            return
        key = f"{answer}.answer"
        if key in self._finished:
            return
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(key, where)
            stream.task = asyncio.create_task(self._pump(stream), name=f"slack-stream:{key}")
        stream.text = text
        stream.changed.set()

    async def _pump(self, stream: _Stream) -> None:
        try:
            while True:
                await asyncio.wait_for(stream.changed.wait(), IDLE_SECONDS)
                stream.changed.clear()
                stream.writing = True
                try:
                    async with self.messages.locked(stream.key):
                        if stream.key in self._finished:
                            return
                        parts = render(stream.text, allow_broadcast=self.allow_broadcast)
                        parts[-1] += TYPING
                        try:
                            await self.messages.write(stream.key, stream.where, parts)
                        finally:  # (a failed write may have reached Slack too)
                            _bounded_add(self._written, stream.key, time.monotonic())
                        stream.writes += 1
                        if stream.writes > 1:  # an edit (the first write posts)
                            kill_point("slack-stream-updated", "slack")
                except Exception as exc:  # noqa: BLE001 - the final delivery shows the answer
                    if faults.is_outage(exc):
                        log.warning("slack: updating the streamed answer %s failed: %s",
                                    stream.key, faults.describe(exc))
                    else:
                        log.exception("slack: updating the streamed answer %s failed",
                                      stream.key)
                finally:
                    stream.writing = False
                await asyncio.sleep(self.interval)
        except TimeoutError:
            pass
        finally:
            if self._streams.get(stream.key) is stream:
                del self._streams[stream.key]


def _bounded_add(seen: OrderedDict, key: str, value: object = None) -> None:
    seen[key] = value
    seen.move_to_end(key)
    while len(seen) > REMEMBERED:
        seen.popitem(last=False)
