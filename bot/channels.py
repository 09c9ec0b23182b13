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
