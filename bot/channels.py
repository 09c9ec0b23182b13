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
    # A request for approval: {"id", "code", "summary"}, for channels that can show it as
    # buttons; the text says how to answer it by typing either way.
    approval: dict[str, Any] | None = None
    # The question was taken back (deleted) before its answer was shown: the delivery
    # does not show it, and asks the channel to `retract` what it streamed of it.
    withdrawn: bool = False
    # For a channel that `shows_progress` on the messages an answer covers: each covered
    # user message's entry data (queued follow-ups answered together with this one).
    covers: tuple[dict[str, Any], ...] = ()


class Channel(Protocol):
    name: str
    # Optional: `circle`, addresses (or "@domain") the channel's people may be sent to
    # without asking (email: `[email] allowed_senders`); `withdrawal_ref(reply_to)`, the
    # history ref under which the connector records that the question was taken back;
    # `retract(message)`, take back what was streamed of a withdrawn question's answer;
    # `shows_progress`, True to be told which messages an answer `covers`;
    # `address_of(address, subject=...)`, the reply address of a new message to `address`
    # (email); `direct_to(reply_to)`, that of a direct message to the person who wrote
    # from `reply_to`, or None (Slack: their DM with Steward).

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
