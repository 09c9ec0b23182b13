"""The terminal as a channel: a delivered answer is published to whoever renders this
process's terminal (`steward ask`, `chat`, `resume`), and what no turn on screen renders
(a reminder firing, an answer finished after the terminal that asked has gone) goes to
the process's `aside`: `run` prints it on its stdout, `chat` between its turns."""

import asyncio
import contextlib
from collections.abc import Callable

from bot.port import Channel, Event, Events, Outbound

SHOW_SECONDS = 5.0  # how long a delivery waits for the terminal to have written it


class TerminalChannel(Channel):
    name = "cli"

    def __init__(self, events: Events):
        self.events = events
        # Shows a message no renderer of its conversation is there for; written when it
        # returns. None: such a message is only published (counted shown if anyone listens).
        self.aside: Callable[[Outbound], None] | None = None

    def how_to_approve(self, code: str) -> str:
        return f"Answer `yes {code}` or `no {code}` (e.g. steward ask \"yes {code}\")"

    async def send(self, message: Outbound) -> dict:
        """Publish the answer; when a terminal renders this conversation, return once it is
        written there (the delivery's result is committed next: a crash in between must
        not leave an answer recorded as delivered that nobody saw)."""
        rendering = self.events.listeners(message.conversation_id, exact=True) > 0
        if not rendering and self.aside is not None:
            self.aside(message)
            return {"shown": True}
        shown = self.events.listeners(message.conversation_id) > 0
        written = asyncio.get_running_loop().create_future() if rendering else None
        self.events.publish(Event(message.conversation_id, "final",
                                  {"text": message.text, "key": message.key,
                                   "conversation_key": message.conversation_key,
                                   "written": written}))
        if written is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(written), SHOW_SECONDS)
        return {"shown": shown}

