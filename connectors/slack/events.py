"""Slack's event payloads, read into one plain shape (`Inbound`), plus who Steward is in
the workspace (`Identity`). Pure functions: no I/O here.

What `parse` reads is checked as it is read (timestamps are `digits.digits`, ids letters
and digits, text is text): an event that is not what Slack sends raises `Malformed` rather
than reaching a conversation key, a lane's order or the store half read. Message text is
unescaped once (`&amp;` `&lt;` `&gt;`), so the agent reads what the person typed."""

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
    # Taken again from the journal after a restart: its processing may have stopped
    # half way, after the commit that makes it look handled.
    replayed: bool = field(default=False, compare=False)
    # Read from Slack's history after Steward was away (`catchup.py`), not an event: it is
    # in no journal, and nothing is marked done for it.
    caught_up: bool = field(default=False, compare=False)

    @property
    def is_dm(self) -> bool:
        return self.channel_type == "im"

    @property
    def order(self) -> tuple[int, ...]:
        """When it happened, for ordering within a conversation (a Slack ts has more
        digits than a float keeps exactly)."""
        return tuple(int(part) for part in (self.edit_ts or self.ts or "0").split(".")[:2])


class Malformed(ValueError):
    """An event with a field that is not what Slack sends (a ts that is no Slack timestamp,
    an id with characters no Slack id has, a number where text belongs). It cannot be taken
    in as it is; the message names the field and what it held."""


# A Slack timestamp: seconds, a dot, a sequence number ("1700000000.000100"). It is the
# message's id, part of conversation keys and the order of a lane, so nothing else passes.
_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,12}")
# Team, channel, user and bot ids: letters and digits only (T…, C…, D…, G…, U…, W…, B…),
# so that a key such as `slack:<team>:<channel>:<ts>` can only be read one way.
_ID = re.compile(r"[A-Za-z0-9]{1,64}")
_EVENT_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_ENTITY = re.compile(r"&(amp|lt|gt);")
_ENTITIES = {"amp": "&", "lt": "<", "gt": ">"}


def is_event_id(value: Any) -> bool:
    """An `event_id` as Slack writes them ("Ev0123ABCD"): what the journal keys by."""
    return isinstance(value, str) and _EVENT_ID.fullmatch(value) is not None


def unescape(text: str) -> str:
    """Slack's message text with its three entities (`&amp;` `&lt;` `&gt;`) read, once:
    what the person typed. Steward's own output is escaped again, once, by `mrkdwn.py`."""
    return _ENTITY.sub(lambda m: _ENTITIES[m.group(1)], text)


class Fields:
    """Typed reads of one object of a payload; a field of the wrong shape is `Malformed`."""

    def __init__(self, obj: Any, where: str):
        if not isinstance(obj, dict):
            raise Malformed(f"{where} is {_shown(obj)}, not an object")
        self.obj = obj
        self.where = where

    def _bad(self, key: str, what: str) -> Malformed:
        return Malformed(f"{self.where}.{key} is {_shown(self.obj.get(key))}, not {what}")

    def text(self, key: str) -> str:
        value = self.obj.get(key)
        if value is None:
            return ""
        if not isinstance(value, str):
            raise self._bad(key, "text")
        return value

    def name(self, key: str) -> str | None:
        """A short word (a type, a subtype, a channel type)."""
        value = self.obj.get(key)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "text")
        return value or None

    def ts(self, key: str, *, required: bool = False) -> str | None:
        value = self.obj.get(key)
        if value is None or value == "":
            if required:
                raise self._bad(key, "a Slack timestamp (digits.digits)")
            return None
        if not isinstance(value, str) or not _TS.fullmatch(value):
            raise self._bad(key, "a Slack timestamp (digits.digits)")
        return value

    def id(self, key: str, *, required: bool = False) -> str:
        value = self.obj.get(key)
        if (value is None or value == "") and not required:
            return ""
        if not isinstance(value, str) or not _ID.fullmatch(value):
            raise self._bad(key, "a Slack id (letters and digits)")
        return value

    def object(self, key: str, where: str | None = None) -> Fields:
        value = self.obj.get(key)
        return Fields({} if value is None else value, where or f"{self.where}.{key}")

    def files(self, key: str) -> tuple[dict, ...]:
        value = self.obj.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(f, dict) for f in value):
            raise self._bad(key, "a list of files")
        return tuple(value)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def channel_type(event: dict) -> str:
    explicit = event.get("channel_type")
    if explicit:
        return explicit
    prefix = (event.get("channel") or "")[:1]
    return {"D": "im", "G": "group"}.get(prefix, "channel")


def _thread(message: Fields, ts: str | None) -> str | None:
    thread = message.ts("thread_ts")
    return thread if thread and thread != ts else None


def _is_self(message: Fields, me: Identity) -> bool:
    bot_id = message.id("bot_id")
    return message.id("user") == me.user_id or (bool(bot_id) and bot_id == me.bot_id)


def parse(body: dict, me: Identity) -> Inbound | None:
    """The event in an `event_callback` body, or None when it is nothing to act on (its
    own messages, joins, unfurls, other event types). Raises `Malformed` when a field it
    reads is not what Slack sends: such an event is quarantined, never half taken in."""
    envelope = Fields(body, "body")
    event_id = envelope.obj.get("event_id") or ""
    if event_id and not is_event_id(event_id):
        raise envelope._bad("event_id", "a Slack event id")
    team = envelope.id("team_id") or me.team
    event = envelope.object("event", "event")
    kind = event.name("type")
    if kind not in ("message", "app_mention"):
        return None
    subtype = event.name("subtype")
    base = dict(event_id=event_id, team=team, channel=event.id("channel", required=True),
                channel_type=event.name("channel_type") or channel_type(event.obj), raw=body)
    if subtype == "message_changed":
        return _edit(event, base, me)
    if subtype == "message_deleted":
        previous = event.object("previous_message")
        if not previous.obj or _is_self(previous, me):
            return None
        ts = event.ts("deleted_ts") or previous.ts("ts", required=True)
        return Inbound(kind="delete", user=previous.id("user"), ts=ts,
                       thread_ts=_thread(previous, previous.ts("ts")), text="",
                       previous_text=unescape(previous.text("text")), **base)
    if subtype not in SPOKEN_SUBTYPES or _is_self(event, me):
        return None
    text = event.text("text")
    bot_id = event.id("bot_id")
    ts = event.ts("ts", required=True)
    return Inbound(kind="message", user=event.id("user") or bot_id, ts=ts,
                   thread_ts=_thread(event, ts), text=unescape(text),
                   files=event.files("files"),
                   mention=kind == "app_mention" or me.mentioned_in(text),
                   bot=bool(bot_id) or subtype == "bot_message", **base)


def _edit(event: Fields, base: dict, me: Identity) -> Inbound | None:
    new = event.object("message")
    previous = event.object("previous_message")
    if new.name("subtype") == "tombstone":
        # A deleted message that has replies (a thread's parent) stays as a tombstone
        # ("This message was deleted."): Slack says so with a change, not a deletion.
        if not previous.obj or _is_self(previous, me):
            return None
        ts = previous.ts("ts") or new.ts("ts", required=True)
        return Inbound(kind="delete", user=previous.id("user"), ts=ts,
                       thread_ts=_thread(previous, previous.ts("ts")), text="",
                       previous_text=unescape(previous.text("text")), **base)
    edited = new.object("edited")
    if _is_self(new, me) or not edited.obj:
        return None  # its own streaming edits; unfurls and reply counts are not edits
    text = new.text("text")
    if text == previous.text("text"):
        return None
    ts = new.ts("ts", required=True)
    return Inbound(kind="edit", user=new.id("user"), ts=ts, thread_ts=_thread(new, ts),
                   text=unescape(text), mention=me.mentioned_in(text),
                   bot=bool(new.id("bot_id")),
                   edit_ts=edited.ts("ts") or event.ts("event_ts"),
                   previous_text=unescape(previous.text("text")), **base)


def clean_text(text: str, me: Identity) -> str:
    """The message as the agent should read it: its own mention taken out."""
    return re.sub(r"[ \t]{2,}", " ", text.replace(f"<@{me.user_id}>", " ")).strip()
