"""The one seam between the agent and a channel that shows its answers (terminal, Slack,
email). Connectors implement `Channel`; the delivery task calls it."""

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Outbound:
    key: str  # the delivery's idempotency key, reserved before the send
    conversation_key: str
    conversation_id: int
    text: str
    reply_to: dict[str, Any]  # channel-specific routing captured from the inbound message


class Channel(Protocol):
    name: str

    async def send(self, message: Outbound) -> dict[str, Any]:
        """Show the message; return what identifies it on the channel."""

    async def find(self, message: Outbound) -> dict[str, Any] | None:
        """After a crash mid-send: the sent message if the channel already has it (looked
        up by `message.key`), else None. Channels that cannot look return None."""


class Connector(Protocol):
    """A running link to one outside channel. Built by the application wiring with
    `(config, deps)` when its section is enabled; `channel` is what deliveries use."""

    name: str
    channel: Channel

    async def start(self) -> None:
        """Connect and begin accepting inbound messages (through `bot.agent.inbox`)."""

    async def stop(self) -> None:
        """Stop accepting; in-flight acknowledgements finish. Called before draining."""
