"""Which conversation a Slack message belongs to, where its answer goes, and whether its
author may talk to Steward. Pure functions over `Inbound` and `SlackConfig`.

    a DM (top level)            slack:<team>:<channel>             answered in the DM
    a thread (DM or channel)    slack:<team>:<channel>:<thread_ts> answered in the thread
    a mention at a channel's    slack:<team>:<channel>:<ts>        answered in a new thread
    top level                                                      under the message

Memory scope (who may later see what was said, in search and long-term facts), the same
rule as the Slack-export importer (connectors/slack/export.py): a DM with Steward, and every
thread in it, is private to that person (`private:slack:<team>:<user>`); a channel, a
private channel or a group DM (mpim) is shared by everyone in it, so each of its threads
is `channel:<channel id>`, whoever mentioned Steward there.
"""

from __future__ import annotations

from typing import Any, Literal

from connectors.slack.config import SlackConfig

from .events import Inbound

Access = Literal["allow", "refuse", "ignore"]

CHANNEL = "slack"  # submissions of the messages taken in, under "<channel>:<ts>"
HISTORY_CHANNEL = "slack:history"  # context recorded without an answer (the port's history)


def deleted_ref(channel: str, ts: str) -> str:
    """The history ref under which the deletion of a user's message is recorded."""
    return f"deleted:{channel}:{ts}"


def key_of(team: str, channel: str, root: str | None) -> str:
    """A conversation's key: the DM or channel, or one thread of it."""
    key = f"slack:{team}:{channel}"
    return key if root is None else f"{key}:{root}"


def owner_of(team: str, user: str) -> str:
    return f"slack:{team}:{user}"


def private_scope(person: str) -> str:
    return f"private:{person}"


def shared_scope(channel: str) -> str:
    return f"channel:{channel}"


def thread_root(ev: Inbound) -> str | None:
    """The thread the answer goes to (None: the DM itself)."""
    if ev.thread_ts:
        return ev.thread_ts
    return None if ev.is_dm else ev.ts


def conversation_key(ev: Inbound) -> str:
    return key_of(ev.team, ev.channel, thread_root(ev))


def reply_to(ev: Inbound) -> dict[str, Any]:
    """What a delivery needs to answer this message (stored with its turn)."""
    return {"team": ev.team, "channel": ev.channel, "thread_ts": thread_root(ev),
            "message_ts": ev.ts, "user": ev.user}


def always_addressed(ev: Inbound) -> bool:
    """A DM or a mention is for Steward; other channel messages only in a followed thread."""
    return ev.is_dm or ev.mention


def may_concern_steward(ev: Inbound) -> bool:
    """Cheap first filter, before anything is stored: a channel message that neither
    mentions Steward nor sits in a thread can never be for it."""
    return always_addressed(ev) or ev.thread_ts is not None or ev.kind != "message"


def access(config: SlackConfig, ev: Inbound) -> Access:
    if ev.bot and not config.answer_bots:
        return "ignore"  # other bots are never refused: two bots would argue forever
    user_ok = config.allow_everyone or ev.user in config.allowed_users
    channel_ok = ev.is_dm or not config.allowed_channels or ev.channel in config.allowed_channels
    if user_ok and channel_ok:
        return "allow"
    return "ignore" if ev.bot else config.unlisted


def owner(ev: Inbound) -> str:
    """Whose conversation it is: the person in a DM, the one who asked in a channel."""
    return owner_of(ev.team, ev.user)


def scope(ev: Inbound) -> str:
    """Who may see what is said in the conversation (set when it is created; a stored
    conversation keeps the scope it was created with)."""
    return private_scope(owner(ev)) if ev.is_dm else shared_scope(ev.channel)
