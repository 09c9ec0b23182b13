"""Slack's event payloads, read into one plain shape (`Inbound`), plus who Steward is in
the workspace (`Identity`). Pure functions: no I/O here."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

# Message subtypes that are a person (or bot) saying something to read.
SPOKEN_SUBTYPES = frozenset({None, "file_share", "thread_broadcast", "bot_message", "me_message"})


@dataclass(frozen=True)
class Identity:
    """Steward in one workspace, from `auth.test`."""

    team: str
    user_id: str  # the bot user (how it is mentioned)
    bot_id: str

    def mentioned_in(self, text: str) -> bool:
        return f"<@{self.user_id}>" in text


@dataclass(frozen=True)
class Inbound:
    kind: str  # "message", "edit" or "delete"
    event_id: str
    team: str
    channel: str
    channel_type: str  # "im", "mpim", "channel", "group"
    user: str  # the author (a bot's id when a bot wrote it)
    ts: str  # the message's own ts (for edits and deletions: the original message)
    thread_ts: str | None  # the thread it is in, when it is a reply (never its own ts)
    text: str
    files: tuple[dict, ...] = ()
    mention: bool = False
    bot: bool = False
    edit_ts: str | None = None  # an edit: when it was edited
    previous_text: str = ""  # edits and deletions: the text before
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_dm(self) -> bool:
        return self.channel_type == "im"

    @property
    def order(self) -> tuple[int, ...]:
        """When it happened, for ordering within a conversation (a Slack ts has more
        digits than a float keeps exactly)."""
        return tuple(int(part) for part in (self.edit_ts or self.ts or "0").split(".")[:2])


def channel_type(event: dict) -> str:
    explicit = event.get("channel_type")
    if explicit:
        return explicit
    prefix = (event.get("channel") or "")[:1]
    return {"D": "im", "G": "group"}.get(prefix, "channel")


def _thread(message: dict) -> str | None:
    thread = message.get("thread_ts")
    return thread if thread and thread != message.get("ts") else None


def _is_self(message: dict, me: Identity) -> bool:
    return message.get("user") == me.user_id or (
        bool(message.get("bot_id")) and message.get("bot_id") == me.bot_id)


def parse(body: dict, me: Identity) -> Inbound | None:
    """The event in an `event_callback` body, or None when it is nothing to act on (its
    own messages, joins, unfurls, other event types)."""
    event = body.get("event") or {}
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return None
    subtype = event.get("subtype")
    base = dict(event_id=body.get("event_id") or "", team=body.get("team_id") or me.team,
                channel=event.get("channel") or "", channel_type=channel_type(event),
                raw=body)
    if subtype == "message_changed":
        return _edit(event, base, me)
    if subtype == "message_deleted":
        previous = event.get("previous_message") or {}
        if _is_self(previous, me) or not previous:
            return None
        return Inbound(kind="delete", user=previous.get("user") or "",
                       ts=event.get("deleted_ts") or previous.get("ts") or "",
                       thread_ts=_thread(previous), text="",
                       previous_text=previous.get("text") or "", **base)
    if subtype not in SPOKEN_SUBTYPES or _is_self(event, me):
        return None
    text = event.get("text") or ""
    is_bot = bool(event.get("bot_id")) or subtype == "bot_message"
    return Inbound(kind="message", user=event.get("user") or event.get("bot_id") or "",
                   ts=event.get("ts") or "", thread_ts=_thread(event), text=text,
                   files=tuple(event.get("files") or ()),
                   mention=kind == "app_mention" or me.mentioned_in(text), bot=is_bot, **base)


def _edit(event: dict, base: dict, me: Identity) -> Inbound | None:
    new = event.get("message") or {}
    previous = event.get("previous_message") or {}
    if new.get("subtype") == "tombstone":
        # A deleted message that has replies (a thread's parent) stays as a tombstone
        # ("This message was deleted."): Slack says so with a change, not a deletion.
        if _is_self(previous, me) or not previous:
            return None
        return Inbound(kind="delete", user=previous.get("user") or "",
                       ts=previous.get("ts") or new.get("ts") or "",
                       thread_ts=_thread(previous), text="",
                       previous_text=previous.get("text") or "", **base)
    if _is_self(new, me) or not new.get("edited"):
        return None  # its own streaming edits; unfurls and reply counts are not edits
    if (new.get("text") or "") == (previous.get("text") or ""):
        return None
    return Inbound(kind="edit", user=new.get("user") or "", ts=new.get("ts") or "",
                   thread_ts=_thread(new), text=new.get("text") or "",
                   mention=me.mentioned_in(new.get("text") or ""),
                   bot=bool(new.get("bot_id")), edit_ts=new["edited"].get("ts") or event.get(
                       "event_ts"), previous_text=previous.get("text") or "", **base)


def clean_text(text: str, me: Identity) -> str:
    """The message as the agent should read it: its own mention taken out."""
    return re.sub(r"[ \t]{2,}", " ", text.replace(f"<@{me.user_id}>", " ")).strip()
