"""What Steward reads besides the message itself: people's names and timezones (users.info,
cached), and the earlier messages of a thread it enters (conversations.replies), as
context."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import NamedTuple

from slack_sdk.errors import SlackApiError

from bot.port import answer_key
from bot.tools.base import known_timezone

from .events import Identity, Inbound, unescape
from .messages import META_TYPE, answered_by
from .routing import CHANNEL
from .web import SlackWeb

log = logging.getLogger(__name__)

MAX_THREAD_MESSAGES = 100  # the newest ones before Steward was asked
MAX_MESSAGE_CHARS = 4000
PAGES = 5
REMEMBERED = 2000
FRESH_SECONDS = 3600.0  # a person's name and zone are asked again after this (travel)
RETRY_SECONDS = 60.0  # after a failed look-up, Slack is asked again after this
LOOKUP_SECONDS = 20.0  # a look-up (the client's own retries included) gives up after this


class Person(NamedTuple):
    name: str  # the display name (their id if Slack will not say)
    timezone: str | None  # their profile's IANA zone (`user.tz`) if it is a known one


class People:
    """users.info, cached. A look-up that fails (an error answer, a 5xx or 429 outlasting
    the client's retries, a dropped or refused connection, a timeout) never fails the event
    it is for: a person already known keeps their last known name and zone, someone new is
    their id with no zone for now, and either way Slack is asked again after RETRY_SECONDS
    rather than FRESH_SECONDS."""

    def __init__(self, web: SlackWeb):
        self.web = web
        # user -> (what is known, when it was asked, whether that look-up succeeded)
        self._people: OrderedDict[str, tuple[Person, float, bool]] = OrderedDict()

    async def person(self, user: str) -> Person:
        """Who `user` is, from users.info, asked at most every FRESH_SECONDS (after a failed
        look-up, every RETRY_SECONDS). Never raises but for cancellation."""
        if not user.startswith(("U", "W")):
            return Person(user, None)
        known = self._people.get(user)
        if known is not None:
            person, asked, ok = known
            if time.monotonic() - asked <= (FRESH_SECONDS if ok else RETRY_SECONDS):
                return person
        try:
            found, ok = await asyncio.wait_for(self._ask(user), LOOKUP_SECONDS), True
        except Exception as exc:  # an outage or a refusal: keep what is known, ask again soon
            reason = (exc.response.get("error") if isinstance(exc, SlackApiError)
                      else repr(exc))
            log.info("slack: users.info %s failed (%s); %s", user, reason,
                     "keeping the last known profile" if known else "using the id for now")
            found, ok = (known[0] if known is not None else Person(user, None)), False
        self._people.pop(user, None)
        self._people[user] = (found, time.monotonic(), ok)
        while len(self._people) > REMEMBERED:
            self._people.popitem(last=False)
        return found

    async def _ask(self, user: str) -> Person:
        info = (await self.web.call("users_info", user=user)).get("user") or {}
        profile = info.get("profile") or {}
        return Person(profile.get("display_name") or info.get("real_name")
                      or info.get("name") or user, known_timezone(info.get("tz")))

    async def name(self, user: str) -> str:
        """A person's display name (their id if Slack will not say)."""
        return (await self.person(user)).name


async def thread_history(web: SlackWeb, me: Identity, people: People, ev: Inbound, *,
                         own_name: str) -> list[dict]:
    """The thread's messages before `ev`, for `bot.agent.inbox.add_history`, with Steward's
    answers to them even where Slack shows those after `ev` (a home restored from a backup
    joins a thread its predecessor answered in: Slack keeps time order, so the answer to a
    reply can come after the next reply, and without it that reply would look unanswered)."""
    assert ev.thread_ts is not None
    thread: list[dict] = []
    cursor = None
    for _ in range(PAGES):
        page = await web.call("conversations_replies", channel=ev.channel, ts=ev.thread_ts,
                              limit=200, cursor=cursor, include_all_metadata=True)
        thread += page.get("messages") or []
        cursor = (page.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            break

    def mine(m: dict) -> bool:
        return m.get("user") == me.user_id or bool(m.get("bot_id") and
                                                    m.get("bot_id") == me.bot_id)

    before = [m for m in thread if float(m["ts"]) < float(ev.ts)][-MAX_THREAD_MESSAGES:]
    asked = {m["ts"] for m in before if not mine(m)}
    keys = {answer_key(CHANNEL, f"{ev.channel}:{ts}") + ".answer" for ts in asked}
    later = [m for m in thread if float(m["ts"]) > float(ev.ts) and mine(m)
             and _answers(m, keys, asked)]
    out = []
    for m in before + later:
        text = unescape(m.get("text") or "")[:MAX_MESSAGE_CHARS]
        for f in m.get("files") or []:
            text += f"\n[attached file: {f.get('name') or f.get('id')}]"
        if not text.strip():
            continue
        author = own_name if mine(m) else await people.name(m.get("user") or m.get("bot_id")
                                                              or "someone")
        # The message a DM thread hangs under is the DM's own, answered there: context
        # here, never covered by the thread's answer (bot/agent/deliver.py `_covered`).
        elsewhere = {"other_conversation": True} if ev.is_dm and m["ts"] == ev.thread_ts \
            else {}
        out.append({"ref": f"{ev.channel}:{m['ts']}", "text": text, "author": author,
                    "role": "assistant" if mine(m) else "user",
                    "data": {"slack": {"channel": ev.channel, "ts": m["ts"],
                                       "user": m.get("user")}, **elsewhere}})
    return out


def _answers(message: dict, keys: set[str], asked: set[str]) -> bool:
    """Whether a post of Steward's says it answers one of `asked` (its key, any part of
    it, or the follow-ups it took in: connectors/slack/messages.py)."""
    meta = message.get("metadata") or {}
    if meta.get("event_type") != META_TYPE:
        return False
    key = (meta.get("event_payload") or {}).get("key")
    if isinstance(key, str) and key.split("#")[0] in keys:
        return True
    return bool(asked.intersection(answered_by(message)))


async def replies_after(web: SlackWeb, ev: Inbound) -> list[dict]:
    """The replies already in the thread under `ev` (a message at a channel's top level),
    as Slack stores them, oldest first."""
    out: list[dict] = []
    cursor = None
    for _ in range(PAGES):
        page = await web.call("conversations_replies", channel=ev.channel, ts=ev.ts,
                              oldest=ev.ts, inclusive=False, limit=200, cursor=cursor)
        out += [m for m in page.get("messages") or [] if float(m["ts"]) > float(ev.ts)]
        cursor = (page.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            break
    return out
