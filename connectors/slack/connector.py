"""The Slack connector: built by the application wiring with `(config, deps)` when
`[slack] enabled = true`; `channel` is what deliveries use, under the name "slack".

    start()  auth.test (who Steward is), replay what the journal holds from the last
             process, begin rendering streamed answers, then open the transport on the
             ack loop (a thread of its own: acks never wait for the agent's work)
    stop()   close the transport (no new events), let queued events finish briefly (the
             rest stay journaled for the next start), stop streaming, release the
             shared HTTP session; deliveries still work while the runtime drains

Threads: the transport, bolt and the journal live on the ack loop; everything else (the
lanes that store events, streaming, deliveries) on the agent's loop.
"""

from __future__ import annotations

import asyncio
import logging

from bot.agent.deps import AgentDeps
from bot.config import Config

from .ackloop import AckLoop
from .events import Identity
from .files import Files
from .history import People
from .inbound import CHANNEL, Inbox
from .journal import Journal
from .messages import Messages
from .outbound import SlackChannel
from .streaming import Streams
from .transport import HttpTransport, SocketTransport, build_app
from .web import SlackWeb
from .working import Working

log = logging.getLogger(__name__)

STOP_GRACE = 5.0  # seconds queued events get to finish on stop
JOURNAL_FILE = "slack-inbox.jsonl"
IDENTITY_ATTEMPTS = 5


class SlackConnector:
    name = CHANNEL

    def __init__(self, config: Config, deps: AgentDeps):
        s = config.slack
        self.config = config
        self.deps = deps
        self.web = SlackWeb(config.secret(s.bot_token_env), s.api_base_url)
        self.messages = Messages(self.web)
        self.working = Working(self.web, deps.store)
        self.streams = Streams(deps.events, deps.store, self.messages, channel=CHANNEL,
                               interval=s.stream_update_seconds)
        self.channel = SlackChannel(self.messages, self.streams, self.working, deps.store)
        self.journal = Journal(config.home / JOURNAL_FILE)  # used on the ack loop only
        self.ack = AckLoop()
        self.inbox = Inbox(deps, s, web=self.web, done=self._done,
                           files=Files(deps.http, self.web.token, s.api_base_url,
                                       s.max_file_bytes),
                           people=People(self.web), working=self.working,
                           agent_name=config.agent.name)
        self.me: Identity | None = None
        self._agent_loop: asyncio.AbstractEventLoop | None = None
        app = build_app(self.web, identity=self._identity, on_event=self._on_event,
                        signing_secret=config.secret(s.signing_secret_env)
                        if s.mode == "http" else None)
        if s.mode == "http":
            self.transport: HttpTransport | SocketTransport = HttpTransport(
                app, s.http_host, s.http_port)
        else:
            self.transport = SocketTransport(app, config.secret(s.app_token_env), self.web)

    def _identity(self) -> Identity:
        assert self.me is not None
        return self.me

    async def _on_event(self, body: dict) -> None:
        """On the ack loop, before the ack: hand the event over, journal it."""
        ev = self.inbox.admit(body)
        if ev is None:
            return
        assert self._agent_loop is not None
        self._agent_loop.call_soon_threadsafe(self.inbox.enqueue, ev)
        await self.journal.append(body)  # its line is queued before any `done` can be

    def _done(self, event_id: str) -> None:
        self.ack.post(self.journal.done, event_id)

    async def start(self) -> None:
        self._agent_loop = asyncio.get_running_loop()
        self.me = self.inbox.me = await self._auth_test()
        await asyncio.to_thread(self.config.home.mkdir, parents=True, exist_ok=True)
        self.ack.start()
        replayed = [ev for body in await self.ack.call(self.journal.open())
                    if (ev := self.inbox.admit(body)) is not None]
        for ev in replayed:
            self.inbox.enqueue(ev)
        if replayed:
            log.info("slack: %d events from before the restart are processed again",
                     len(replayed))
        self.streams.start()
        await self.ack.call(self.transport.start())

    async def _auth_test(self) -> Identity:
        for attempt in range(1, IDENTITY_ATTEMPTS + 1):
            try:
                info = await self.web.call("auth_test")
                return Identity(team=info["team_id"], user_id=info["user_id"],
                                bot_id=info.get("bot_id") or "")
            except Exception as exc:
                if attempt == IDENTITY_ATTEMPTS:
                    raise
                log.warning("slack: auth.test failed (%s); retrying", exc)
                await asyncio.sleep(attempt)
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        if self.ack.loop is None:
            return
        await self.ack.call(self.transport.stop())
        if not await self.inbox.lanes.join(STOP_GRACE):
            log.warning("slack: unfinished events stay journaled for the next start")
        await self.inbox.lanes.close()
        await self.streams.stop()
        await self.ack.call(self.journal.close())
        await self.ack.stop()
        await self.web.close()  # calls in flight finish; later ones get a session each
