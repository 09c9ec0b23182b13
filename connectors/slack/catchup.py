"""Catch-up: Slack messages sent while Steward was not listening are answered when it is
back, however long it was away (over HTTP Slack sends an event three times within minutes;
to a disconnected Socket Mode app, nothing at all).

On start, and after each reconnect in Socket Mode, a pass lists the conversations Steward
is in (users.conversations, once, in cursor pages) and reads what arrived in those it
serves:

    DMs       each DM Steward has a transcript of, however long it was quiet, the latest
              active `MAX_CONVERSATIONS`; and, up to `MAX_CONVERSATIONS`, each other DM
              listed whose person routing answers, or refuses while no refusal was given
              there yet (a person's very first message) (conversations.history)
    threads   each thread it follows (one it has a transcript of) that was active lately,
              in a channel or a DM, the latest active `MAX_CONVERSATIONS`
              (conversations.replies)
    channels  the top level of each channel, private channel and group DM listed (where a
              mention can get an answer or a refusal), up to `MAX_CONVERSATIONS`: only the
              messages that mention Steward are taken, as their `app_mention` would have
              been; the chatter around them gets nothing (conversations.history)

read in cursor pages (429s are waited out by the Web API client, `web.py`), from `MARGIN`
before the mark (the newest message Steward took) on, and never from further back than
`[slack] catchup_hours` (0: no catch-up); a conversation with nothing new costs one call.
"Lately": active in the store within `catchup_hours` before Steward last wrote the mark
(when it was last up). The mark is the position `slack:<team>` / `catchup` kept through
the port: {"ts": a Slack ts, "at": when it was written}. The listing needs the scopes
im:read, mpim:read, channels:read and groups:read: without them Slack answers
missing_scope (said once a process), and the pass reads the DMs and threads Steward knows.

Each message read goes through the inbox as an event would (`Inbound.caught_up`), in its
conversation's lane, under the same submission id (`<channel>:<ts>`): one taken before, or
that also arrives as a retried event (a mention's `app_mention` or `message`), is taken
once; routing decides who is answered, refused or ignored, as for a live message. The
mark moves with what is taken (an event once journaled, a message read here once it is
taken), is written every `MARK_SECONDS` and at stop, and never past a message read here
that is not taken yet: a process that stops half way reads it again.

An outage during a pass (the store's or Slack's) is waited out, with backoff, and the pass
made again; a conversation Slack will not show (channel_not_found, not_in_channel,
thread_not_found...) is passed over.

Not read: a reply in a thread it does not follow yet (a new thread under an old DM
message, a mention made in a reply under a channel message that did not mention it), a
channel it is not in (none of its events would come either), and a conversation past the
limits above: those wait for their events as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import threading
import time
from typing import Any

from slack_sdk.errors import SlackApiError

from bot.port import AgentPort, Position, answer_key
from connectors.slack.config import SlackConfig

from . import faults, routing
from .events import Identity, Inbound, Malformed, channel_type, parse
from .inbound import Inbox
from .messages import META_TYPE, answered_by
from .routing import CHANNEL
from .web import SlackWeb

log = logging.getLogger(__name__)

MARGIN = 900.0  # seconds before the mark read again (Slack retries an event for ~5 min)
PAGE = 200  # messages asked for per page
PAGES = 10  # pages per conversation and pass at the most
MAX_CONVERSATIONS = 200  # DMs, first DMs, threads and channels read per pass, each
MARK_SECONDS = 30.0  # between writes of the mark
RETRY_FIRST, RETRY_MAX = 2.0, 60.0  # seconds before a failed pass is made again; doubling
ERROR_PASSES = 3  # passes failing with an error that is no outage before it gives up
POSITION = "catchup"
LISTED = "im,mpim,public_channel,private_channel"  # what users.conversations is asked for
_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,12}")
_ID = re.compile(r"[A-Za-z0-9]{1,64}")


def order(ts: str) -> tuple[int, ...]:
    """A Slack ts, compared exactly (a float does not keep all its digits)."""
    return tuple(int(part) for part in ts.split(".")[:2])


def owner_of(team: str) -> str:
    """The namespace the mark is kept under."""
    return f"slack:{team}"


def kind_of(listed: dict) -> str:
    """A conversation's channel type as its events say it (im, mpim, group, channel), from
    what users.conversations lists."""
    if listed.get("is_im"):
        return "im"
    if listed.get("is_mpim"):
        return "mpim"
    return "group" if listed.get("is_private") else "channel"


@dataclasses.dataclass(frozen=True)
class Place:
    """A conversation a pass reads: a DM's or a channel's top level (`root` None), or a
    thread; `kind` is its channel type as events say it."""

    channel: str
    root: str | None
    kind: str

    @property
    def mentions_only(self) -> bool:
        """A channel's top level: only what mentions Steward is for it."""
        return self.root is None and self.kind != "im"

    def __str__(self) -> str:
        return self.channel + (f" (thread {self.root})" if self.root else "")


class CatchUp:
    def __init__(self, port: AgentPort, config: SlackConfig, web: SlackWeb, inbox: Inbox):
        self.port = port
        self.config = config
        self.web = web
        self.inbox = inbox
        self.horizon = config.catchup_hours * 3600.0
        self._lock = threading.Lock()  # `taken` is called on the ack loop too
        self._newest: str | None = None  # the newest ts taken
        self._written: str | None = None  # the mark as last written
        self._reading: dict[tuple[str, str], str] = {}  # read here, not taken yet: -> ts
        self._passes: asyncio.Task | None = None
        self._marking: asyncio.Task | None = None
        self._again = False
        self._unlisted_said = False  # that Slack would not list the conversations
        self.finished = 0  # passes made to the end (tests wait for them)

    @property
    def enabled(self) -> bool:
        return self.horizon > 0

    # -- any thread -------------------------------------------------------------------

    def taken(self, ts: str) -> None:
        """A message up to `ts` is Steward's now (an event journaled, or taken)."""
        if not _TS.fullmatch(ts or ""):
            return
        with self._lock:
            if self._newest is None or order(ts) > order(self._newest):
                self._newest = ts

    # -- on the agent's loop ------------------------------------------------------------

    def settled(self, ev: Inbound) -> None:
        """A message read here is taken (or quarantined): the inbox's `settled`."""
        self._reading.pop((ev.channel, ev.ts), None)
        self.taken(ev.ts)

    def start(self) -> None:
        if not self.enabled:
            return
        self.request()
        self._marking = asyncio.create_task(self._keep_mark(), name="slack-catchup-mark")

    def request(self) -> None:
        """Make a pass now, or once more after the one under way."""
        if not self.enabled:
            return
        if self._passes is not None and not self._passes.done():
            self._again = True
            return
        self._passes = asyncio.create_task(self._run(), name="slack-catchup")

    async def halt(self) -> None:
        """No more passes (at stop, before the lanes finish)."""
        for task in (self._passes, self._marking):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def save(self, within: float = 5.0) -> None:
        """Write the mark a last time (at stop, once the lanes are closed)."""
        if not self.enabled or self.inbox.me is None:
            return
        try:
            await asyncio.wait_for(self._write_mark(), within)
        except Exception as exc:  # noqa: BLE001 - the next start reads a little more
            log.warning("slack: could not keep where the next catch-up starts: %s",
                        faults.describe(exc))

    # -- passes ------------------------------------------------------------------------

    async def _run(self) -> None:
        tries = errors = 0
        away: tuple[str, float] | None = None  # (whose outage, since) holding the passes
        while True:
            self._again = False
            try:
                read, places = await self._pass()
            except Exception as exc:
                kind = faults.outage_of(exc)
                if kind is None:
                    errors += 1
                    if errors >= ERROR_PASSES:
                        log.error("slack: catching up failed %d times; it is tried again at "
                                  "the next start or reconnect", errors, exc_info=exc)
                        return
                    log.warning("slack: catching up failed (%s); trying again",
                                faults.describe(exc), exc_info=exc)
                elif away is None:
                    away = (kind, time.monotonic())
                    log.warning("slack: cannot catch up while %s is unavailable (%s); trying "
                                "again by itself", "the store" if kind == "store" else "Slack",
                                faults.describe(exc))
                await asyncio.sleep(min(RETRY_MAX, RETRY_FIRST * 2 ** min(tries, 16)))
                tries += 1
                continue
            if away is not None:
                log.warning("slack: %s is back after %.0f s; caught up",
                            "the store" if away[0] == "store" else "Slack",
                            time.monotonic() - away[1])
                away = None
            log.info("slack: caught up: %d messages read in %d conversations", read, places)
            self.finished += 1
            tries = errors = 0
            if not self._again:
                return

    async def _pass(self) -> tuple[int, int]:
        me = self.inbox.me
        assert me is not None
        now = time.time()
        stored = await self.port.position(owner_of(me.team), POSITION) or {}
        mark = stored.get("ts") if isinstance(stored.get("ts"), str) else None
        if mark is not None:
            self.taken(mark)
            self._written = self._written or mark
        floor = now - self.horizon
        # From the stored mark, not from the newest message this life took: an event that
        # arrived before this pass (a fresh message, right after a restart or a restore)
        # says nothing about the ones before it that no event brought.
        oldest = floor if mark is None else max(floor, float(mark) - MARGIN)
        try:
            last_up = min(float(stored.get("at") or now), now)
        except (TypeError, ValueError):
            last_up = now
        places = await self._places(me, last_up - self.horizon)
        read = 0
        for place in places:
            try:
                messages = await self._read(place, oldest)
            except SlackApiError as exc:
                if faults.is_outage(exc):
                    raise
                log.info("slack: %s is not read to catch up: %s", place, faults.describe(exc))
                continue
            answered = _answered(messages)
            for m in messages:
                key = answer_key(CHANNEL, f"{place.channel}:{m['ts']}") + ".answer"
                if m["ts"] in answered or key in answered:
                    continue  # Steward answered it already (a home before a restore did)
                ev = self._inbound(me, place, m, floor)
                if ev is not None:
                    self._reading[(ev.channel, ev.ts)] = ev.ts
                    self.inbox.enqueue(ev)
                    read += 1
        return read, len(places)

    async def _places(self, me: Identity, active_since: float) -> list[Place]:
        """Each conversation to read: the DMs it knows, first DMs, the threads it follows,
        the channels' top levels."""
        listed = await self._listed()
        kinds = {c["id"]: kind_of(c) for c in listed}
        dms: dict[str, Place] = {}
        for conversation in await self.port.conversations_active(
                f"slack:{me.team}:D", since=0.0, limit=MAX_CONVERSATIONS, parts=3):
            channel = conversation.key.split(":")[2]
            dms[channel] = Place(channel, None, "im")
        threads: dict[tuple[str, str], Place] = {}
        for conversation in await self.port.conversations_active(
                f"slack:{me.team}:", since=active_since, limit=MAX_CONVERSATIONS, parts=4):
            _, _, channel, root = conversation.key.split(":")
            if _TS.fullmatch(root):
                threads[(channel, root)] = Place(
                    channel, root, kinds.get(channel) or channel_type({"channel": channel}))
        firsts: list[Place] = []
        channels: list[Place] = []
        for c in listed:
            kind = kinds[c["id"]]
            if kind != "im":
                if self._heard_in(c["id"]):
                    channels.append(Place(c["id"], None, kind))
            elif c["id"] not in dms and await self._first_dm(me, c):
                firsts.append(Place(c["id"], None, "im"))
        return [*dms.values(), *_capped(firsts, "DMs"), *threads.values(),
                *_capped(channels, "channels")]

    async def _listed(self) -> list[dict]:
        """The conversations Steward is in, as users.conversations lists them (DMs with the
        person's id as `user`); what was listed so far when Slack refuses (a missing scope).
        An outage is raised: the pass is made again."""
        found: dict[str, dict] = {}
        cursor = None
        try:
            for _ in range(PAGES):
                page = await self.web.call("users_conversations", types=LISTED,
                                           exclude_archived=True, limit=PAGE,
                                           **({"cursor": cursor} if cursor else {}))
                for c in page.get("channels") or []:
                    if isinstance(c, dict) and _ID.fullmatch(str(c.get("id") or "")):
                        found[c["id"]] = c
                cursor = (page.get("response_metadata") or {}).get("next_cursor")
                if not cursor:
                    break
            else:
                log.warning("slack: Steward is in more than %d conversations; the rest are "
                            "not read to catch up", PAGE * PAGES)
        except SlackApiError as exc:
            if faults.is_outage(exc):
                raise
            if not self._unlisted_said:
                self._unlisted_said = True
                data = getattr(exc.response, "data", None)
                needed = data.get("needed") if isinstance(data, dict) else None
                log.warning("slack: Slack will not list the conversations Steward is in "
                            "(%s%s): only the DMs and threads it knows are read to catch "
                            "up, not a person's first DM nor a mention in a channel (the "
                            "app needs the scopes im:read, mpim:read, channels:read, "
                            "groups:read)", faults.describe(exc),
                            f", needs {needed}" if needed else "")
        return list(found.values())

    async def _first_dm(self, me: Identity, listed: dict) -> bool:
        """Whether a DM it has no transcript of is read: its person is answered, or
        refused and no refusal was given there yet (routing decides, as for a live
        message; a refusal is given once per conversation)."""
        user = listed.get("user")
        if not isinstance(user, str) or not _ID.fullmatch(user):
            return False
        decision = routing.access(self.config, Inbound(
            kind="message", event_id="", team=me.team, channel=listed["id"],
            channel_type="im", user=user, ts="0.0", thread_ts=None, text=""))
        if decision != "refuse":
            return decision == "allow"
        key = routing.key_of(me.team, listed["id"], None)
        return await self.port.conversation(key) is None

    def _heard_in(self, channel: str) -> bool:
        """Whether a mention in a channel can get an answer or a refusal (routing.access,
        for anyone there)."""
        c = self.config
        if c.unlisted == "refuse":
            return True
        return ((c.allow_everyone or bool(c.allowed_users))
                and (not c.allowed_channels or channel in c.allowed_channels))

    async def _read(self, place: Place, oldest: float) -> list[dict]:
        """The messages after `oldest` in a DM's or channel's top level, or a thread, oldest
        first."""
        channel, root = place.channel, place.root
        method = "conversations_replies" if root else "conversations_history"
        args: dict[str, Any] = {"channel": channel, "oldest": f"{oldest:.6f}", "limit": PAGE,
                                "include_all_metadata": True}  # Steward's answers' keys
        if root:
            args["ts"] = root
        found: dict[str, dict] = {}
        cursor = None
        for _ in range(PAGES):
            page = await self.web.call(method, **args, **({"cursor": cursor} if cursor else {}))
            for m in page.get("messages") or []:
                if isinstance(m, dict) and _TS.fullmatch(str(m.get("ts") or "")):
                    found[m["ts"]] = m
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
        else:
            log.warning("slack: %s has more than %d messages to catch up; the rest wait "
                        "for the next pass", place, PAGE * PAGES)
        return [found[ts] for ts in sorted(found, key=order)]

    def _inbound(self, me: Identity, place: Place, m: dict, floor: float) -> Inbound | None:
        """The message as its `message` event would have it; None when it is nothing to
        take (too old, a thread's first message, chatter at a channel's top level)."""
        if m["ts"] == place.root or float(m["ts"]) < floor:
            return None  # a thread's first message is its DM's or channel's; too old
        event = {**m, "type": "message", "channel": place.channel, "channel_type": place.kind}
        try:
            ev = parse({"event": event, "team_id": me.team}, me)
        except Malformed as exc:
            log.info("slack: passed over a message of %s while catching up: %s", place, exc)
            return None
        if ev is None or ev.kind != "message" or (place.mentions_only and not ev.mention):
            return None
        return dataclasses.replace(ev, caught_up=True)

    # -- the mark ----------------------------------------------------------------------

    def _mark(self) -> str | None:
        """The newest ts taken, but never past a message read here and not yet taken."""
        with self._lock:
            newest = self._newest
        waiting = min(self._reading.values(), key=order, default=None)
        if newest is None or waiting is None:
            return newest
        return min(newest, waiting, key=order)

    async def _write_mark(self) -> None:
        me = self.inbox.me
        ts = self._mark()
        if me is None or ts is None or ts == self._written:
            return
        await self.port.advance(Position(owner_of(me.team), POSITION,
                                         {"ts": ts, "at": time.time()}))
        self._written = ts

    async def _keep_mark(self) -> None:
        failing = False
        while True:
            await asyncio.sleep(MARK_SECONDS)
            try:
                await self._write_mark()
            except Exception as exc:  # noqa: BLE001 - written at the next tick
                if not failing:
                    log.info("slack: writing where the next catch-up starts failed (%s); "
                             "it is written again later", faults.describe(exc))
                failing = True
                continue
            failing = False


def _answered(messages: list[dict]) -> set[str]:
    """What Steward's own posts among `messages` say they answer: their keys (an answer is
    keyed by its message: `answer_key`) and the ts of the follow-ups they took in."""
    found: set[str] = set()
    for m in messages:
        meta = m.get("metadata") or {}
        if meta.get("event_type") == META_TYPE:
            key = (meta.get("event_payload") or {}).get("key")
            if isinstance(key, str):
                found.add(key)
            found.update(answered_by(m))
    return found


def _capped(places: list[Place], what: str) -> list[Place]:
    """The first `MAX_CONVERSATIONS` of the places listed (Slack's order)."""
    if len(places) > MAX_CONVERSATIONS:
        log.warning("slack: %d %s to catch up in, more than %d: the rest are not read",
                    len(places), what, MAX_CONVERSATIONS)
    return places[:MAX_CONVERSATIONS]
