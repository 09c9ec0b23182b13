"""What Steward reads besides the message itself: people's names and timezones (users.info,
cached), and the earlier messages of a thread it enters (conversations.replies), as
context."""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import NamedTuple

from slack_sdk.errors import SlackApiError

from bot.tools import known_timezone

from .events import Identity, Inbound
from .web import SlackWeb

log = logging.getLogger(__name__)

MAX_THREAD_MESSAGES = 100  # the newest ones before Steward was asked
MAX_MESSAGE_CHARS = 4000
PAGES = 5
REMEMBERED = 2000
FRESH_SECONDS = 3600.0  # a person's name and zone are asked again after this (travel)


class Person(NamedTuple):
    name: str  # the display name (their id if Slack will not say)
    timezone: str | None  # their profile's IANA zone (`user.tz`) if it is a known one


class People:
    def __init__(self, web: SlackWeb):
        self.web = web
        self._people: OrderedDict[str, tuple[Person, float]] = OrderedDict()

    async def person(self, user: str) -> Person:
        """Who `user` is, from users.info, asked at most every FRESH_SECONDS (a failed
        look-up gives their id and no zone, until it is asked again)."""
        if not user.startswith(("U", "W")):
            return Person(user, None)
        known = self._people.get(user)
        if known is None or time.monotonic() - known[1] > FRESH_SECONDS:
            try:
                info = (await self.web.call("users_info", user=user)).get("user") or {}
                profile = info.get("profile") or {}
                found = Person(profile.get("display_name") or info.get("real_name")
                               or info.get("name") or user, known_timezone(info.get("tz")))
            except SlackApiError as exc:
                log.info("slack: users.info %s: %s", user, exc.response.get("error"))
                found = Person(user, None)
            self._people.pop(user, None)
            self._people[user] = known = (found, time.monotonic())
            while len(self._people) > REMEMBERED:
                self._people.popitem(last=False)
        return known[0]

    async def name(self, user: str) -> str:
        """A person's display name (their id if Slack will not say)."""
        return (await self.person(user)).name


async def thread_history(web: SlackWeb, me: Identity, people: People, ev: Inbound, *,
                         own_name: str) -> list[dict]:
    """The thread's messages before `ev`, for `bot.agent.inbox.add_history`."""
    assert ev.thread_ts is not None
    messages: list[dict] = []
    cursor = None
    for _ in range(PAGES):
        page = await web.call("conversations_replies", channel=ev.channel, ts=ev.thread_ts,
                              latest=ev.ts, inclusive=False, limit=200, cursor=cursor)
        messages += [m for m in page.get("messages") or [] if float(m["ts"]) < float(ev.ts)]
        cursor = (page.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            break
    out = []
    for m in messages[-MAX_THREAD_MESSAGES:]:
        mine = m.get("user") == me.user_id or (m.get("bot_id") and m.get("bot_id") == me.bot_id)
        text = (m.get("text") or "")[:MAX_MESSAGE_CHARS]
        for f in m.get("files") or []:
            text += f"\n[attached file: {f.get('name') or f.get('id')}]"
        if not text.strip():
            continue
        author = own_name if mine else await people.name(m.get("user") or m.get("bot_id")
                                                           or "someone")
        out.append({"ref": f"{ev.channel}:{m['ts']}", "text": text, "author": author,
                    "role": "assistant" if mine else "user",
                    "data": {"slack": {"channel": ev.channel, "ts": m["ts"],
                                       "user": m.get("user")}}})
    return out
