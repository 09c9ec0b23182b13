"""In-process notifications of committed state, for whatever renders it (the terminal
today, Slack's streaming message later). Only things already committed are published, so
a renderer never shows text the store does not have."""

import asyncio
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    conversation_id: int
    kind: str  # "partial" (streamed text so far), "final" (a delivered answer), "retry"
    data: dict[str, Any] = field(default_factory=dict)


class Events:
    def __init__(self):
        self._queues: list[tuple[int | None, asyncio.Queue]] = []

    def subscribe(self, conversation_id: int | None = None) -> asyncio.Queue:
        """A queue of events for one conversation (None: all of them)."""
        queue: asyncio.Queue = asyncio.Queue()
        self._queues.append((conversation_id, queue))
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._queues = [(c, q) for c, q in self._queues if q is not queue]

    def listeners(self, conversation_id: int, *, exact: bool = False) -> int:
        """Subscribers of this conversation (`exact`: not counting those of all of them)."""
        wanted = (conversation_id,) if exact else (None, conversation_id)
        return sum(1 for c, _ in self._queues if c in wanted)

    def publish(self, event: Event) -> None:
        for wanted, queue in self._queues:
            if wanted is None or wanted == event.conversation_id:
                queue.put_nowait(event)
