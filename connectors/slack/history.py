"""What Steward reads besides the message itself: people's names (users.info, cached), and
the earlier messages of a thread it enters (conversations.replies), as context."""

from __future__ import annotations

import logging
from collections import OrderedDict

from slack_sdk.errors import SlackApiError

from .events import Identity, Inbound
from .web import SlackWeb

log = logging.getLogger(__name__)

MAX_THREAD_MESSAGES = 100  # the newest ones before Steward was asked
MAX_MESSAGE_CHARS = 4000
PAGES = 5
REMEMBERED = 2000


class People:
    def __init__(self, web: SlackWeb):
        self.web = web
        self._names: OrderedDict[str, str] = OrderedDict()

    async def name(self, user: str) -> str:
        """A person's display name (their id if Slack will not say)."""
        if not user.startswith(("U", "W")):
            return user
        if user not in self._names:
            try:
                info = (await self.web.call("users_info", user=user)).get("user") or {}
                profile = info.get("profile") or {}
                name = (profile.get("display_name") or info.get("real_name")
                        or info.get("name") or user)
            except SlackApiError as exc:
                log.info("slack: users.info %s: %s", user, exc.response.get("error"))
                name = user
            self._names[user] = name
            while len(self._names) > REMEMBERED:
                self._names.popitem(last=False)
        return self._names[user]


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
