"""The terminal as a channel: a delivered answer is published to whoever renders this
process's terminal (`steward ask`, `chat`, `resume`)."""

import asyncio
import contextlib

from bot.port import Event, Events, Outbound

SHOW_SECONDS = 5.0  # how long a delivery waits for the terminal to have written it


class TerminalChannel:
    name = "cli"

    def __init__(self, events: Events):
        self.events = events

    async def send(self, message: Outbound) -> dict:
        """Publish the answer; when a terminal renders this conversation, return once it is
        written there (the delivery's result is committed next: a crash in between must
        not leave an answer recorded as delivered that nobody saw)."""
        shown = self.events.listeners(message.conversation_id) > 0
        rendering = self.events.listeners(message.conversation_id, exact=True) > 0
        written = asyncio.get_running_loop().create_future() if rendering else None
        self.events.publish(Event(message.conversation_id, "final",
                                  {"text": message.text, "key": message.key,
                                   "conversation_key": message.conversation_key,
                                   "written": written}))
        if written is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(written), SHOW_SECONDS)
        return {"shown": shown}

    async def find(self, message: Outbound) -> dict | None:
        return None  # a terminal keeps no history to look in
