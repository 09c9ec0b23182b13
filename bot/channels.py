"""The one seam between the agent and a channel that shows its answers (terminal, Slack,
email). A connector subclasses `Channel`; the delivery task, the permission rules, the
approval request and the schedule tool call it. What only some channels can do is declared
here with a default that means "this channel cannot", so the core asks the channel object
and never its name (no `getattr` probing, no test of which channel it is)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


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


def typed_approval(code: str) -> str:
    """How to answer an approval request by typing: what every channel understands."""
    return f"Answer `yes {code}` or `no {code}`"


class Channel(ABC):
    """What shows the agent's answers. `send` is the one thing every channel does; the rest
    are capabilities with a default that says the channel lacks them."""

    name: str
    # Addresses (or "@domain") the channel's people may be sent mail to without asking
    # (email: `[email] allowed_senders`); bot.tools.permissions adds them to the circle.
    circle: tuple[str, ...] = ()
    # True to be told which messages an answer `covers` (Slack's "working on it" sign).
    shows_progress: bool = False
    # True if the channel can start a new conversation with an address (`address_of`).
    reaches_addresses: bool = False

    @abstractmethod
    async def send(self, message: Outbound) -> dict[str, Any]:
        """Show the message; return what identifies it on the channel."""

    async def find(self, message: Outbound) -> dict[str, Any] | None:
        """After a crash mid-send: the sent message if the channel already has it (looked
        up by `message.key`), else None. A channel that keeps no history cannot look."""
        return None

    async def retract(self, message: Outbound) -> dict[str, Any]:
        """Take back what was streamed of the answer to a withdrawn question; what was
        done, for the delivery's result. Nothing streamed, nothing to take back."""
        return {}

    def withdrawal_ref(self, reply_to: dict[str, Any]) -> str | None:
        """The history ref under which the connector records that the message `reply_to`
        answers was taken back (deleted), or None: such a channel never withdraws."""
        return None

    def address_of(self, address: str, *, subject: str) -> dict[str, Any] | None:
        """The reply address of a new message to `address` (a scheduled job's results),
        or None when the channel cannot start one (see `reaches_addresses`)."""
        return None

    def direct_to(self, reply_to: dict[str, Any]) -> dict[str, Any] | None:
        """The reply address of a direct message to the person who wrote from `reply_to`,
        or None (Slack: their DM with Steward)."""
        return None

    def asker_address(self, who: str | None) -> str | None:
        """The address the person known on this channel as `who` is mailed at, when the
        channel knows people by address (email), else None."""
        return None

    def how_to_approve(self, code: str) -> str:
        """The line of an approval request that says how to answer it on this channel."""
        return typed_approval(code)


class Connector(ABC):
    """A running link to one outside channel. Built by the application wiring from its own
    config section and a `Host` (bot.port) when the section is enabled; `channel` is what
    deliveries use."""

    name: str
    channel: Channel

    @property
    def up(self) -> bool:
        """Whether it is connected now (`steward run` and the health file say so)."""
        return True

    @abstractmethod
    async def start(self) -> None:
        """Connect and begin accepting inbound messages (through the port)."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop accepting; in-flight acknowledgements finish. Called before draining."""
