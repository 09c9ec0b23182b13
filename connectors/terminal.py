"""The terminal as a channel: a delivered answer is published to whoever renders this
process's terminal (`steward ask`, `chat`, `resume`)."""

from bot.agent.events import Event, Events
from bot.channels import Outbound


class TerminalChannel:
    name = "cli"

    def __init__(self, events: Events):
        self.events = events

    async def send(self, message: Outbound) -> dict:
        shown = self.events.listeners(message.conversation_id) > 0
        self.events.publish(Event(message.conversation_id, "final",
                                  {"text": message.text, "key": message.key,
                                   "conversation_key": message.conversation_key}))
        return {"shown": shown}

    async def find(self, message: Outbound) -> dict | None:
        return None  # a terminal keeps no history to look in
