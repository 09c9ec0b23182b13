"""The channel port: everything a connector may ask of the agent, and the names it needs.

A connector (Slack, email, the terminal) imports this module, `bot.channels` and its own
libraries, never `store` and never the agent's modules: what it asks goes through an
`AgentPort` (the composition root hands it one, inside a `Host`), and what the agent tells
it comes as calls on its `Channel` (`bot.channels`: deliver an answer, find one after a
crash, retract one whose question was withdrawn) and as `Event`s (streamed partial text,
carrying the channel and the reply address). `AgentPort` is a Protocol: the methods below
are all a connector calls, and a test may hand a connector anything that has them
(`bot.agent_port.LocalPort` is the real one).

Asking, in the agent's terms:

    keep      a shared file's bytes (an image, a PDF, an office document): read and stored
              once by content hash, before the submission that refers to it (`Kept`)
    submit    an inbound message, with the files it brought (stored as documents), and
              the connector's position in its source (`Position`) in the same commit
    history   earlier messages of a conversation joined late: context, no answer
    withdraw  a message taken back (deleted): its unstarted turns never run
    refuse    a stranger's message: recorded, and one polite answer (keyed: never twice)
    skip      a message not to be answered, with the reason (kept, listed, never retried)
    quarantine  an input that cannot be taken in, with the reason (`steward quarantine`)
    advance   the position alone (a message that vanished, or was taken before)

with several workers on one PostgreSQL store, `journal_put`/`journal_done`/`journal_stale`
(what was acknowledged, where every worker sees it) and `leader` (a loop that runs once),
and reading what it needs to route: `submission` (was this id taken, and into which turn),
`conversation`, `answer_pending`, `said` (a message's user entries), `position`, and the
approvals a click or a reply answers. Each `submit`/`refuse`/`withdraw` that adds work
wakes the runner.

A port call may raise the store's outage (`store_unavailable` tells it): wait, keep what
was being taken in, try again. A channel's `send` says it could not reach its world with
`NotPerformed` (nothing happened) or `Unavailable` (something may have).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bot.agent.events import Event, Events
from bot.agent.inbox import Accepted, answer_key
from bot.attachments import REF, Kept
from bot.channels import Channel, Connector, Outbound
from bot.runtime import NotPerformed, Unavailable
from store import is_unavailable

if TYPE_CHECKING:
    import httpx

    from store import Conversation, Entry

__all__ = [
    "REF", "Accepted", "AgentPort", "Channel", "Connector", "Event", "Events", "Host",
    "Kept", "NotPerformed", "Outbound", "Position", "Unavailable", "answer_key",
    "store_unavailable",
]

# Whether an error a port call raised is the store's outage (the database or its disk is
# not there now), never the fault of what was being taken in: wait, keep it, try again.
store_unavailable = is_unavailable


@dataclass(frozen=True)
class Position:
    """Where a connector is in its source (a mailbox's UID cursor): a JSON value kept as a
    versioned document `name` under `owner`, moved in the commit of what it passes."""

    owner: str
    name: str
    value: dict[str, Any]


class AgentPort(Protocol):
    """What a connector calls on the agent (see the module docstring)."""

    @property
    def events(self) -> Events:
        """The streamed partial answers, to show as they grow."""

    @property
    def http(self) -> httpx.AsyncClient:
        """The process's HTTP client (files a message links to)."""

    @property
    def shared(self) -> bool:
        """Whether other workers may share this store (PostgreSQL): then what a channel
        acknowledges must be in the store (`journal_put`) before the acknowledgement, and
        a loop that must run once waits to be `leader`."""

    def reconciling(self) -> bool:
        """Whether this home was just restored from a backup (bot/app/restore.py): what came
        in since the snapshot may have been answered already, by the home before it."""

    # -- taking messages in --------------------------------------------------------------

    async def keep(self, data: bytes, *, name: str, media_type: str) -> Kept:
        """A shared file read and its bytes stored by content hash, durably: put `Kept.ref`
        in the message's data under `REF` and `Kept.text` in its text. Bad input is a
        note in `Kept.text`, never an exception."""

    async def submit(self, *, channel: str, external_ids: list[str], conversation_key: str,
                     text: str, author: str | None = None, owner: str | None = None,
                     scope: str | None = None, reply_to: dict[str, Any] | None = None,
                     data: dict[str, Any] | None = None, timezone: str | None = None,
                     files: Sequence[tuple[str, Any]] = (), at: Position | None = None,
                     answers: str | None = None) -> Accepted:
        """One message for the agent; `files` are (document name, value) pairs stored in
        the conversation with it, `at` the position past it. A message taken before only
        moves the position. `answers`: which of the ids names the message itself wherever
        it is read (default: the first)."""

    async def history(self, *, channel: str, conversation_key: str,
                      messages: list[dict[str, Any]], owner: str | None = None,
                      scope: str | None = None, settled_only: bool = False) -> int:
        """Earlier messages of a conversation joined late, as context; how many were new."""

    async def withdraw(self, *, channel: str, ref: str, conversation_id: int,
                       said: list[Entry], note: str, withdrawn_note: str,
                       author: str | None = None, data: dict[str, Any] | None = None
                       ) -> list[Entry]:
        """A message taken back: its unstarted turns never run; what was withdrawn."""

    async def refuse(self, *, channel: str, external_ids: list[str], conversation_key: str,
                     text: str, reply_to: dict[str, Any], owner: str | None = None,
                     scope: str | None = None, payload: dict[str, Any] | None = None) -> bool:
        """Record a message not taken from someone not allowed, with one answer per
        conversation (never twice). True if it was new."""

    async def skip(self, channel: str, external_ids: list[str], payload: dict[str, Any], *,
                   at: Position | None = None) -> bool:
        """A message that is not answered, recorded with why; True if it was new."""

    async def quarantine(self, channel: str, external_ids: list[str], reason: str,
                         payload: Any = None, *, at: Position | None = None) -> bool:
        """An input that cannot be taken in, kept with the reason under each of its ids;
        True if it was new."""

    async def advance(self, at: Position) -> None:
        """Move the position alone."""

    # -- what a connector reads to route ----------------------------------------------

    async def submission(self, channel: str, external_id: str) -> dict[str, Any] | None:
        """How an id was taken: {"state", "conversation_id", "task_id", "payload"}, or None."""

    async def conversation(self, key: str) -> Conversation | None: ...

    async def conversation_by_id(self, conversation_id: int) -> Conversation | None: ...

    async def answer_pending(self, turn_id: str) -> bool:
        """Whether the turn's answer is still to come."""

    async def said(self, conversation_id: int, turn_id: str, mine: Callable[[dict], bool],
                   *, tail: int = 200) -> list[Entry]:
        """A message's user entries (the message and its edits), else the turn's own."""

    async def position(self, owner: str, name: str) -> dict[str, Any] | None:
        """The value last moved to with `advance` (or a submission's `at`), or None."""

    async def conversations_active(self, prefix: str, *, since: float, limit: int = 200,
                                   parts: int | None = None) -> list[Conversation]:
        """The conversations under `prefix` active since `since`, latest first (catch-up)."""

    # -- several workers on one store ---------------------------------------------------

    async def journal_put(self, channel: str, event_id: str, body: dict, lease: float,
                          taker: str | None = None) -> None: ...

    async def journal_done(self, channel: str, event_ids: list[str]) -> None: ...

    async def journal_stale(self, channel: str, *, lease: float, taker: str | None = None,
                            mine: bool = False) -> list[dict]:
        """Acknowledged events no live worker is taking in (their taker died)."""

    def leader(self, name: str, *, poll_seconds: float = 2.0) -> Any:
        """Leadership of a job among the workers (see store/leader.py)."""

    # -- approvals answered on the channel (a button) ------------------------------------

    async def answer_approval(self, approval_id: str, approved: bool, *, by: str) -> str:
        """"approved", "denied", or why not ("not yours", "expired", "answered", ...)."""

    async def approval_answer(self, approval_id: str) -> tuple[bool, str] | None:
        """The stored answer (approved, by whom), whichever click or reply gave it."""


@dataclass(frozen=True)
class Host:
    """What a connector gets from the process besides its own config section: the port,
    the home (its journal and files live there), the assistant's name (it signs with it),
    and how to read a secret named in its section (`secret(env_name) -> value`)."""

    port: AgentPort
    home: Path
    agent_name: str
    secret: Callable[[str], str]
