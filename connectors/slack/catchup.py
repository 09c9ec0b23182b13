"""Catch-up: Slack messages sent while Steward was not listening are answered when it is
back, however long it was away (over HTTP Slack sends an event three times within minutes;
to a disconnected Socket Mode app, nothing at all).

On start, and after each reconnect in Socket Mode, a pass reads what arrived in the
conversations Steward serves:

    DMs      each DM Steward has a transcript of, however long it was quiet, the latest
             active `MAX_CONVERSATIONS` (conversations.history)
    threads  each thread it follows (one it has a transcript of) that was active lately,
             in a channel or a DM, the latest active `MAX_CONVERSATIONS`
             (conversations.replies)

read in cursor pages (429s are waited out by the Web API client, `web.py`), from `MARGIN`
before the mark (the newest message Steward took) on, and never from further back than
`[slack] catchup_hours` (0: no catch-up). "Lately": active in the store within
`catchup_hours` before Steward last wrote the mark (when it was last up). The mark is the
position `slack:<team>` / `catchup` kept through the port: {"ts": a Slack ts, "at": when
it was written}.

Each message read goes through the inbox as an event would (`Inbound.caught_up`), in its
conversation's lane, under the same submission id (`<channel>:<ts>`): one taken before, or
that also arrives as a retried event, is taken once. The mark moves with what is taken
(an event once journaled, a message read here once it is taken), is written every
`MARK_SECONDS` and at stop, and never past a message read here that is not taken yet: a
process that stops half way reads it again.

An outage during a pass (the store's or Slack's) is waited out, with backoff, and the pass
made again; a conversation Slack will not show (channel_not_found, not_in_channel,
thread_not_found...) is passed over.

Not read: a channel's top level (a mention there while Steward was away), a thread it
never followed (a new thread under an old DM message), a DM it has no transcript of (a
person's very first message): those wait for their events as before.
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

from bot.port import AgentPort, Position
from connectors.slack.config import SlackConfig

from . import faults
from .events import Identity, Inbound, Malformed, channel_type, parse
from .inbound import Inbox
from .web import SlackWeb

log = logging.getLogger(__name__)

MARGIN = 900.0  # seconds before the mark read again (Slack retries an event for ~5 min)
PAGE = 200  # messages asked for per page
PAGES = 10  # pages per conversation and pass at the most
MAX_CONVERSATIONS = 200  # DMs, and threads, read per pass: the latest active first
MARK_SECONDS = 30.0  # between writes of the mark
RETRY_FIRST, RETRY_MAX = 2.0, 60.0  # seconds before a failed pass is made again; doubling
ERROR_PASSES = 3  # passes failing with an error that is no outage before it gives up
POSITION = "catchup"
_TS = re.compile(r"[0-9]{1,12}\.[0-9]{1,12}")


def order(ts: str) -> tuple[int, ...]:
    """A Slack ts, compared exactly (a float does not keep all its digits)."""
    return tuple(int(part) for part in ts.split(".")[:2])


def owner_of(team: str) -> str:
    """The namespace the mark is kept under."""
    return f"slack:{team}"


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
        if isinstance(stored.get("ts"), str):
            self.taken(stored["ts"])
            self._written = self._written or stored["ts"]
        with self._lock:
            newest = self._newest
        floor = now - self.horizon
        oldest = floor if newest is None else max(floor, float(newest) - MARGIN)
        try:
            last_up = min(float(stored.get("at") or now), now)
        except (TypeError, ValueError):
            last_up = now
        places = await self._places(me, last_up - self.horizon)
        read = 0
        for channel, root in places:
            try:
                messages = await self._read(channel, root, oldest)
            except SlackApiError as exc:
                if faults.is_outage(exc):
                    raise
                log.info("slack: %s%s is not read to catch up: %s", channel,
                         f" (thread {root})" if root else "", faults.describe(exc))
                continue
            for m in messages:
                ev = self._inbound(me, channel, root, m, floor)
                if ev is not None:
                    self._reading[(ev.channel, ev.ts)] = ev.ts
                    self.inbox.enqueue(ev)
                    read += 1
        return read, len(places)

    async def _places(self, me: Identity, active_since: float) -> list[tuple[str, str | None]]:
        """(channel, thread ts or None) of each conversation to read."""
        found: dict[tuple[str, str | None], None] = {}
        for conversation in await self.port.conversations_active(
                f"slack:{me.team}:D", since=0.0, limit=MAX_CONVERSATIONS, parts=3):
            found[(conversation.key.split(":")[2], None)] = None  # a DM
        for conversation in await self.port.conversations_active(
                f"slack:{me.team}:", since=active_since, limit=MAX_CONVERSATIONS, parts=4):
            _, _, channel, root = conversation.key.split(":")
            if _TS.fullmatch(root):
                found[(channel, root)] = None  # a thread it follows
        return list(found)

    async def _read(self, channel: str, root: str | None, oldest: float) -> list[dict]:
        """The messages after `oldest` in a DM (root None) or a thread, oldest first."""
        method = "conversations_replies" if root else "conversations_history"
        args: dict[str, Any] = {"channel": channel, "oldest": f"{oldest:.6f}", "limit": PAGE}
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
            log.warning("slack: %s%s has more than %d messages to catch up; the rest wait "
                        "for the next pass", channel, f" (thread {root})" if root else "",
                        PAGE * PAGES)
        return [found[ts] for ts in sorted(found, key=order)]

    def _inbound(self, me: Identity, channel: str, root: str | None, m: dict,
                 floor: float) -> Inbound | None:
        if m["ts"] == root or float(m["ts"]) < floor:
            return None  # a thread's first message is its DM's or channel's; too old
        event = {**m, "type": "message", "channel": channel,
                 "channel_type": channel_type({"channel": channel})}
        try:
            ev = parse({"event": event, "team_id": me.team}, me)
        except Malformed as exc:
            log.info("slack: passed over a message of %s while catching up: %s", channel, exc)
            return None
        if ev is None or ev.kind != "message":
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
