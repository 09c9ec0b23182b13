"""Steward's answers in Slack, each part found again by the key in its metadata.

An answer of several parts is keyed `KEY`, `KEY#2`, `KEY#3`... (`part_key`). Every post
carries `metadata = {"event_type": "steward_reply", "event_payload": {"key": ...}}`, so
after a restart the very same message is found (conversations.replies for a thread,
conversations.history for a DM, from the user's message on) and edited in place rather
than posted again. What this process posted or saw is remembered (bounded); a key it does
not know is looked up in Slack before anything is posted under it.

A scheduled answer for a person's DM is addressed to the person (`channel` = their U... id):
`conversations.open` turns that into the DM's own id (D...) before anything is read or
posted, since conversations.history knows only conversations. The id is remembered in
memory; a restarted process asks again (the call is idempotent and answers the same DM).

`watch()` tells a delivery whether any write of its own may have reached Slack, so that an
outage can be reported as "nothing shown" (`NotPerformed`) or "in doubt" (`Unavailable`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError

from bot.port import answer_key
from bot.runtime.killpoints import kill_point

from . import faults
from .routing import CHANNEL
from .web import SlackWeb

log = logging.getLogger(__name__)

META_TYPE = "steward_reply"
REMEMBERED = 5000  # keys kept in memory
LOOKUP_PAGES = 10  # pages of 200 messages searched after the user's message
POST_ATTEMPTS = 3
POST_RETRY_SECONDS = 0.5  # times the attempt: the pause before looking and posting again
GONE = {"message_not_found", "cant_update_message"}  # deleted by a person in Slack


def part_key(key: str, index: int) -> str:
    return key if index == 0 else f"{key}#{index + 1}"


def is_user_id(value: str) -> bool:
    """A person's id (U..., W... on Enterprise Grid), not a conversation's (C, G, D...)."""
    return value[:1] in ("U", "W") and value[1:].isalnum()


@dataclass
class Posted:
    channel: str
    ts: str
    text: str
    answers: tuple[str, ...] = ()  # the messages it answers, when more than its own


@dataclass
class Touched:
    """Whether a write (post, edit, delete) may have changed what Slack shows."""
    maybe: bool = False


_touched: ContextVar[Touched | None] = ContextVar("slack_touched", default=None)


class Messages:
    def __init__(self, web: SlackWeb):
        self.web = web
        self._known: OrderedDict[str, Posted | None] = OrderedDict()
        self._dms: OrderedDict[str, str] = OrderedDict()  # person -> Steward's DM with them
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    # -- per-answer lock (a stream and the final delivery never write at once) -------

    @asynccontextmanager
    async def locked(self, key: str):
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    @contextmanager
    def watch(self) -> Iterator[Touched]:
        """Within (in this asyncio task): note whether any write may have reached Slack."""
        touched = Touched()
        token = _touched.set(touched)
        try:
            yield touched
        finally:
            _touched.reset(token)

    # -- where ----------------------------------------------------------------------

    async def resolve(self, where: dict[str, Any]) -> dict[str, Any]:
        """`where` with a person's id as the channel replaced by their DM's id."""
        person = where.get("channel") or ""
        if not is_user_id(person):
            return where
        dm = self._dms.get(person)
        if dm is None:
            opened = await self.web.call("conversations_open", users=person)
            dm = opened["channel"]["id"]
            self._dms[person] = dm
            while len(self._dms) > REMEMBERED:
                self._dms.popitem(last=False)
        return {**where, "channel": dm}

    # -- finding --------------------------------------------------------------------

    def _remember(self, key: str, posted: Posted | None) -> None:
        self._known[key] = posted
        self._known.move_to_end(key)
        while len(self._known) > REMEMBERED:
            self._known.popitem(last=False)

    async def find(self, key: str, where: dict[str, Any]) -> Posted | None:
        """The message posted under `key`, from memory or else from Slack."""
        found = self._known.get(key)
        if found is None:
            await self._scan(await self.resolve(where), whole=_once_per_place(key))
            found = self._known.get(key)
        return found

    def answered(self, channel: str, ts: tuple[str, ...], *, besides: str = "") -> bool:
        """Whether each message `ts` of `channel` has an answer this process has seen, other
        than the one keyed `besides` (and its parts): one keyed by that message
        (bot.port.answer_key) or one that says it answers it."""
        known = [(k, p) for k, p in self._known.items() if p is not None and p.channel == channel
                 and not (besides and (k == besides or k.startswith(besides + "#")))]
        said = {t for _, p in known for t in p.answers}
        keys = {k for k, _ in known}
        return all(t in said or f"{answer_key(CHANNEL, f'{channel}:{t}')}.answer" in keys
                   for t in ts)

    async def answer_to(self, where: dict[str, Any], ts: str) -> list[Posted]:
        """Steward's posts that Slack shows answering the message `ts` at `where` (read
        from the message on), oldest first: keyed by it, or saying they answer it. Empty
        if there is none."""
        where = await self.resolve(where)
        channel = where["channel"]
        if not self.answered(channel, (ts,)):
            await self._scan(where)
        key = f"{answer_key(CHANNEL, f'{channel}:{ts}')}.answer"
        posts = {p.ts: p for k, p in self._known.items()
                 if p is not None and p.channel == channel
                 and (k == key or k.startswith(key + "#") or ts in p.answers)}
        return [posts[t] for t in sorted(posts, key=float)]

    async def _scan(self, where: dict[str, Any], *, whole: bool = False) -> None:
        """Read the channel (or thread) after the user's message and remember every
        Steward message in it by key. `whole`: from the start of the thread (the newest
        pages of a channel) instead: a message said once per place (a refusal) may have
        been posted after an earlier message than this one."""
        channel, thread = where["channel"], where.get("thread_ts")
        args: dict[str, Any] = {"channel": channel, "limit": 200, "include_all_metadata": True}
        if where.get("message_ts") and not whole:
            args["oldest"] = where["message_ts"]
        cursor = None
        for _ in range(LOOKUP_PAGES):
            if thread:
                page = await self.web.call("conversations_replies", ts=thread, cursor=cursor,
                                           **args)
            else:
                page = await self.web.call("conversations_history", cursor=cursor, **args)
            for m in page.get("messages") or []:
                meta = m.get("metadata") or {}
                found = (meta.get("event_payload") or {}).get("key")
                if meta.get("event_type") == META_TYPE and found:
                    self._remember(found, Posted(channel, m["ts"], m.get("text") or "",
                                                 answered_by(m)))
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return

    # -- writing --------------------------------------------------------------------

    async def write(self, key: str, where: dict[str, Any], parts: list[str],
                    blocks: list[dict] | None = None,
                    answers: tuple[str, ...] = ()) -> list[Posted]:
        """Make the answer's messages show `parts`: post the missing ones, edit changed
        ones, delete parts beyond the new end that this process knows of. `blocks`, if
        given, is how the first part is laid out (its text is the fallback). `answers`: the
        ts of the messages it answers when it answers more than its own (queued follow-ups),
        kept in the first part's metadata for a home restored from a backup to see (the
        catch-up). Call it holding `locked(key)`."""
        where = await self.resolve(where)
        shown = []
        scanned = False
        for i, text in enumerate(parts):
            k = part_key(key, i)
            found = self._known.get(k)
            if found is None and not scanned:
                await self._scan(where, whole=_once_per_place(key))
                scanned, found = True, self._known.get(k)
            layout = blocks if i == 0 else None
            said = answers if i == 0 else ()
            if found is not None and (found.text != text or found.answers != said):
                found = await self._update(k, found, text, layout, said)
            if found is None:
                found = await self._post(k, where, text, layout, said)
            shown.append(found)
        extra = len(parts)
        while (stale := self._known.get(part_key(key, extra))) is not None:
            await self._delete(part_key(key, extra), stale)
            extra += 1
        return shown

    async def remove(self, key: str, where: dict[str, Any]) -> int:
        """Delete every part of an answer that exists (the question was withdrawn)."""
        where = await self.resolve(where)
        removed, i = 0, 0
        while (found := await self.find(part_key(key, i), where)) is not None:
            await self._delete(part_key(key, i), found)
            removed, i = removed + 1, i + 1
        return removed

    async def _update(self, key: str, posted: Posted, text: str,
                      blocks: list[dict] | None = None,
                      answers: tuple[str, ...] = ()) -> Posted | None:
        """Edit a part; None if it is gone (deleted in Slack), so it is posted again."""
        layout = {"blocks": blocks} if blocks else {}
        try:
            await self._write("chat_update", channel=posted.channel, ts=posted.ts, text=text,
                              metadata=_metadata(key, answers), **layout)
        except SlackApiError as exc:
            if exc.response.get("error") not in GONE:
                raise
            log.warning("slack: the message of %s is gone; posting it again", key)
            self._remember(key, None)
            return None
        updated = Posted(posted.channel, posted.ts, text, answers)
        self._remember(key, updated)
        return updated

    async def _delete(self, key: str, posted: Posted) -> None:
        try:
            await self._write("chat_delete", channel=posted.channel, ts=posted.ts)
        except SlackApiError as exc:
            if exc.response.get("error") not in GONE:
                raise
        self._remember(key, None)

    async def _post(self, key: str, where: dict[str, Any], text: str,
                    blocks: list[dict] | None = None,
                    answers: tuple[str, ...] = ()) -> Posted:
        args: dict[str, Any] = {"channel": where["channel"], "text": text,
                                "metadata": _metadata(key, answers), "unfurl_links": False}
        if blocks:
            args["blocks"] = blocks
        if where.get("thread_ts"):
            args["thread_ts"] = where["thread_ts"]
        for attempt in range(1, POST_ATTEMPTS + 1):
            try:
                response = await self._write("chat_postMessage", **args)
                break
            except SlackApiError as exc:
                status = exc.response.status_code
                if status < 500 or attempt == POST_ATTEMPTS:
                    raise
                log.warning("slack: chat.postMessage answered %s; looking before retrying",
                            status)
            except (aiohttp.ClientError, OSError) as exc:
                if attempt == POST_ATTEMPTS:
                    raise
                log.warning("slack: chat.postMessage failed (%s); looking before retrying", exc)
            await asyncio.sleep(POST_RETRY_SECONDS * attempt)
            await self._scan(where)
            found = self._known.get(key)
            if found is not None:
                return found
        posted = Posted(response["channel"], response["ts"], text, answers)
        self._remember(key, posted)
        kill_point("slack-posted", "slack")
        return posted

    async def _write(self, method: str, **kwargs: Any):
        """A call that changes what Slack shows (noted for `watch`). chat.postMessage goes
        through the client that does not retry on its own (see web.py)."""
        touched = _touched.get()
        try:
            if method == "chat_postMessage":
                response = await self.web.post(**kwargs)
            else:
                response = await self.web.call(method, **kwargs)
        except Exception as exc:
            if touched is not None and not faults.not_done(exc):
                touched.maybe = True
            raise
        if touched is not None:
            touched.maybe = True
        return response


def _once_per_place(key: str) -> bool:
    """A key said once per conversation, whatever message prompted it (port.refuse's)."""
    return "-refusal:" in key


def _metadata(key: str, answers: tuple[str, ...] = ()) -> dict[str, Any]:
    payload: dict[str, Any] = {"key": key}
    if answers:
        payload["answers"] = list(answers)
    return {"event_type": META_TYPE, "event_payload": payload}


def answered_by(message: dict) -> tuple[str, ...]:
    """The ts of the messages a Steward post says it answers besides its own (metadata)."""
    meta = message.get("metadata") or {}
    if meta.get("event_type") != META_TYPE:
        return ()
    said = (meta.get("event_payload") or {}).get("answers")
    return tuple(str(ts) for ts in said) if isinstance(said, list) else ()
