"""The Slack connector: built by the composition root with `(section, host)` when
`[slack] enabled = true`; `channel` is what deliveries use, under the name "slack".

    start()  auth.test (who Steward is; while Slack cannot be reached, asked again in the
             background with backoff, and what follows waits for it), replay what the
             journal holds from the last process (a line that cannot be taken in is
             quarantined with the reason and leaves the journal; start-up and the events
             after it go on), begin rendering streamed answers, then open the transport
             on the ack loop (a thread of its own: acks never wait for the agent's work),
             and catch up in the background with what was said while Steward was away
             (`catchup.py`; again after each reconnect in Socket Mode)
    stop()   close the transport (no new events), stop catching up, let queued events
             finish briefly (the rest stay journaled for the next start), keep where the
             next catch-up starts, stop streaming, release the shared HTTP session;
             deliveries still work while the runtime drains

An event is acknowledged only once it is journaled: one the journal could not take (a full
disk) gets a 503 (no ack in Socket Mode), and Slack sends it again.

Threads: the transport, bolt and the journal live on the ack loop; everything else (the
lanes that store events, streaming, deliveries) on the agent's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket

from bot.home import make_private
from bot.port import Connector, Host
from bot.runtime.killpoints import kill_point

from . import faults
from .ackloop import AckLoop
from .actions import Clicks, parse_click
from .catchup import CatchUp
from .config import SlackConfig
from .events import Identity, Inbound, Malformed, is_event_id
from .files import Files
from .history import People
from .inbound import Inbox
from .journal import Journal
from .messages import Messages
from .outbound import SlackChannel
from .routing import CHANNEL
from .shared_journal import SharedJournal
from .streaming import Streams
from .transport import HttpTransport, SocketTransport, build_app
from .web import SlackWeb
from .working import Working

log = logging.getLogger(__name__)

STOP_GRACE = 5.0  # seconds queued events get to finish on stop
CLICK_SECONDS = 2.5  # a click applied later than this is not acked (Slack waits 3 s)
JOURNAL_FILE = "slack-inbox.jsonl"
CONNECT_BACKOFF_MAX = 60.0  # seconds between tries to reach Slack at the most


class SlackConnector(Connector):
    name = CHANNEL

    def __init__(self, config: SlackConfig, host: Host):
        s = self.config = config  # the [slack] section
        self.home = host.home  # the journal lives there
        self.port = port = host.port
        self.web = SlackWeb(host.secret(s.bot_token_env), s.api_base_url)
        self.messages = Messages(self.web)
        self.working = Working(self.web)
        self.streams = Streams(port.events, self.messages, channel=CHANNEL,
                               interval=s.stream_update_seconds,
                               allow_broadcast=s.allow_broadcast_mentions)
        self.channel = SlackChannel(self.messages, self.streams, self.working,
                                    allow_broadcast=s.allow_broadcast_mentions)
        # Used on the ack loop only. Several workers on one store: in the store, where
        # any of them takes over what one acked and did not finish (shared_journal.py).
        self.journal: Journal | SharedJournal = Journal(self.home / JOURNAL_FILE)
        if port.shared:
            self.journal = SharedJournal(port, s.takeover_seconds,
                                         f"{socket.gethostname()}:{self.home}",
                                         lambda: self._agent_loop)
        self._sweeping: asyncio.Task | None = None
        self.ack = AckLoop()
        self.inbox = Inbox(port, s, web=self.web, done=self._done,
                           files=Files(port.http, self.web.token, s.api_base_url,
                                       s.max_file_bytes),
                           people=People(self.web), working=self.working,
                           agent_name=host.agent_name)
        self.inbox.answer_to = self.messages.answer_to
        self.catchup = CatchUp(port, s, self.web, self.inbox)
        self.inbox.settled = self.catchup.settled
        self.clicks = Clicks(port, self.web)
        self.me: Identity | None = None
        self._agent_loop: asyncio.AbstractEventLoop | None = None
        self._quarantining: set[asyncio.Task] = set()  # on the agent's loop
        self._connecting: asyncio.Task | None = None  # Slack unreachable at start
        app = build_app(self.web, identity=self._identity, on_event=self._on_event,
                        on_action=self._on_action,
                        signing_secret=host.secret(s.signing_secret_env)
                        if s.mode == "http" else None)
        if s.mode == "http":
            self.transport: HttpTransport | SocketTransport = HttpTransport(
                app, s.http_host, s.http_port, host.secret(s.signing_secret_env))
        else:
            self.transport = SocketTransport(app, host.secret(s.app_token_env), self.web,
                                             on_reconnect=self._reconnected)

    def _identity(self) -> Identity:
        assert self.me is not None
        return self.me

    async def _on_event(self, body: dict) -> bool:
        """On the ack loop, before the ack: hand the event over, journal it; whether to
        acknowledge it. An event that cannot be taken in is acked all the same (Slack would
        only send it again) and quarantined on the agent's loop; journaled first when it
        has an event id to be found by, so that a crash before the quarantine is stored
        still quarantines it, at the next start. One without an id is quarantined without
        the journal: a crash in between loses it, and it was nothing Steward could have
        answered. An event the journal could not take (a full disk, an I/O error) is not
        acknowledged: Slack sends it again (it may be taken in meanwhile, harmlessly: a
        message is submitted once)."""
        try:
            ev = self.inbox.admit(body)
        except Exception as exc:
            journaled = is_event_id(body.get("event_id"))
            assert self._agent_loop is not None
            self._agent_loop.call_soon_threadsafe(
                self._quarantine_soon, body, _reason(exc),
                body["event_id"] if journaled else None)
            return not journaled or await self._journaled(body)
        if ev is None:
            return True
        assert self._agent_loop is not None
        self._agent_loop.call_soon_threadsafe(self.inbox.enqueue, ev)
        if not await self._journaled(body):  # its line is queued before any `done` can be
            return False
        if ev.kind == "message":
            self.catchup.taken(ev.ts)
        return True

    async def _journaled(self, body: dict) -> bool:
        try:
            await self.journal.append(body)
        except Exception as exc:  # noqa: BLE001 - not acknowledged: Slack sends it again
            log.warning("slack: event %s could not be journaled (%s); not acknowledged, "
                        "Slack sends it again", body.get("event_id"), faults.describe(exc))
            return False
        return True

    def _reconnected(self) -> None:
        """On the ack loop: Socket Mode connected again; what was said meanwhile is read."""
        if self._agent_loop is not None:
            self._agent_loop.call_soon_threadsafe(self.catchup.request)

    async def _on_action(self, body: dict) -> bool:
        """On the ack loop: apply a click on an approval button on the agent's loop and
        say whether it was (the ack waits for it; see actions.py). Clicks on anything
        else, and payloads that are not what Slack sends, are acked and dropped."""
        try:
            click = parse_click(body, self._identity())
        except Malformed as exc:
            log.warning("slack: dropped an interaction: %s", exc)
            return True
        if click is None:
            return True
        assert self._agent_loop is not None
        applied = asyncio.run_coroutine_threadsafe(self.clicks.take(click), self._agent_loop)
        try:
            await asyncio.wait_for(asyncio.wrap_future(applied), CLICK_SECONDS)
        except Exception as exc:  # the person sees the click fail, and clicks again
            log.warning("slack: a click on approval %s was not applied: %s",
                        click.approval_id, exc)
            return False
        kill_point("slack-click-applied", "slack")
        return True

    def _done(self, event_id: str) -> None:
        self.ack.post(self.journal.done, event_id)

    def _quarantine_soon(self, body: dict, reason: str, journaled_as: str | None) -> None:
        task = asyncio.create_task(self._quarantine(body, reason, journaled_as))
        self._quarantining.add(task)
        task.add_done_callback(self._quarantining.discard)

    async def _quarantine(self, body: dict, reason: str, journaled_as: str | None) -> None:
        """Quarantine an event, then take it out of the journal (if it is in it). If the
        store fails, it stays journaled and the next start tries again."""
        if await self.inbox.quarantine(body, reason) and journaled_as is not None:
            self._done(journaled_as)

    @property
    def up(self) -> bool:
        """Connected: Slack said who Steward is and events are being taken."""
        return self.me is not None

    async def start(self) -> None:
        """Begin serving, at once if Slack answers; if it cannot be reached (a home server
        boots before its network is up, Slack has an outage) keep asking in the background
        with backoff, one log line per try, and begin then. A refusal (a revoked token)
        is raised: no retry fixes it."""
        self._agent_loop = asyncio.get_running_loop()
        try:
            me = await self.web.call("auth_test")
        except Exception as exc:
            if not faults.is_outage(exc):
                raise
            log.warning("slack: cannot reach Slack (%s); connecting in the background",
                        faults.describe(exc))
            self._connecting = asyncio.create_task(self._connect_later())
            return
        await self._begin(me)

    async def _connect_later(self) -> None:
        delay = 1.0
        while True:
            await asyncio.sleep(delay)
            delay = min(CONNECT_BACKOFF_MAX, delay * 2)
            try:
                me = await self.web.call("auth_test")
            except Exception as exc:
                if not faults.is_outage(exc):
                    log.error("slack: Slack refused the bot token (%s); not connecting",
                              faults.describe(exc))
                    return
                log.warning("slack: still cannot reach Slack (%s); next try in %.0f s",
                            faults.describe(exc), delay)
                continue
            await self._begin(me)
            log.warning("slack: connected")  # the answer to the warnings above
            return

    async def _begin(self, info: dict) -> None:
        self.me = self.inbox.me = Identity(team=info["team_id"], user_id=info["user_id"],
                                           bot_id=info.get("bot_id") or "")
        await asyncio.to_thread(make_private, self.home)  # the journal lives there
        self.ack.start()
        bodies = await self.ack.call(self.journal.open())
        if isinstance(self.journal, SharedJournal):
            bodies += await self._carry_over(self.journal)
        count = await self._replay(bodies)
        if count:
            log.info("slack: %d events from before the restart are processed again", count)
        if isinstance(self.journal, SharedJournal):
            self._sweeping = asyncio.create_task(self._sweep(self.journal))
        self.streams.start()
        await self.ack.call(self.transport.start())
        self.catchup.start()

    async def _carry_over(self, journal: SharedJournal) -> list[dict]:
        """What this home's own file journal still holds (written before the store was
        shared, or by an older version): moved into the store, then out of the file."""
        if not (self.home / JOURNAL_FILE).exists():
            return []
        local = Journal(self.home / JOURNAL_FILE)
        bodies = await self.ack.call(local.open())
        for body in bodies:
            await self.port.journal_put(CHANNEL, body.get("event_id") or "", body,
                                        journal.lease, journal.taker)

        async def emptied() -> None:  # on the ack loop, where the file journal lives
            for body in bodies:
                local.done(body.get("event_id") or "")
            await local.close()
        await self.ack.call(emptied())
        return bodies

    async def _replay(self, bodies: list[dict]) -> int:
        """Take journaled events in again (after a restart, or a dead worker's); one that
        cannot be read is quarantined and leaves the journal. How many were queued."""
        replayed: list[Inbound] = []
        refused: list[tuple[dict, str]] = []
        for body in bodies:
            try:
                ev = self.inbox.admit(body)
            except Exception as exc:  # never in the way of start-up or the events after it
                refused.append((body, _reason(exc)))
                continue
            if ev is not None:
                replayed.append(dataclasses.replace(ev, replayed=True))
        for ev in replayed:
            self.inbox.enqueue(ev)
        for body, reason in refused:  # the journal's key for it, whatever it is
            await self._quarantine(body, reason, body.get("event_id") or "")
        return len(replayed)

    async def _sweep(self, journal: SharedJournal) -> None:
        """Several workers: now and then take in what a worker acked and did not finish.
        A sweep that fails is made again at the next tick (said once, and once when one
        works again)."""
        failing = False
        while True:
            try:
                count = await self._replay(await journal.stale())
                if count:
                    log.warning("slack: %d acknowledged events another worker did not finish "
                                "are taken in here", count)
                if failing:
                    log.warning("slack: sweeping the shared journal works again")
                failing = False
            except Exception as exc:  # the store is away: the next sweep tries again
                if not failing:
                    log.warning("slack: sweeping the shared journal failed (%s); it is "
                                "tried again every %.0f s", faults.describe(exc),
                                journal.lease / 4)
                failing = True
            await asyncio.sleep(journal.lease / 4)

    async def stop(self) -> None:
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connecting
        if self.ack.loop is None:  # never connected: only the HTTP session to release
            await self.web.close()
            return
        await self.ack.call(self.transport.stop())
        log.debug("slack: stopping: the connection closed")
        await self.catchup.halt()
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.gather(self._sweeping, return_exceptions=True)
        if not await self.inbox.lanes.join(STOP_GRACE):
            log.warning("slack: unfinished events stay journaled for the next start")
        if self._quarantining:  # what is not stored by then is quarantined at the next start
            _, late = await asyncio.wait(set(self._quarantining), timeout=STOP_GRACE)
            for task in late:  # waiting for the store: the journal keeps the event
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        await self.inbox.lanes.close()
        log.debug("slack: stopping: events taken in")
        await self.catchup.save()
        await self.streams.stop()
        await self.clicks.stop(STOP_GRACE)
        await self.ack.call(self.journal.close())
        await self.ack.stop()
        log.debug("slack: stopping: the ack loop ended")
        await self.web.close()  # calls in flight finish; later ones get a session each


def _reason(exc: Exception) -> str:
    """Why an event could not be taken in, as `steward quarantine` shows it."""
    if isinstance(exc, Malformed):
        return f"malformed event: {exc}"
    log.error("slack: reading an event failed", exc_info=exc)
    return f"the event could not be read: {type(exc).__name__}: {exc}"
