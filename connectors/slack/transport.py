"""How events reach Steward: slack-bolt's AsyncApp in front, in either mode.

Bolt runs its built-in middleware (the signing-secret check with its five-minute
timestamp window in HTTP mode, url_verification, ssl_check, dropping Steward's own
events); then one middleware of ours takes every `event_callback`, journals it and answers
200. Nothing else happens before the ack, and all of it runs on the connector's ack loop
(`ackloop.py`): processing runs afterwards in the lanes on the agent's loop, so the ack
never waits for the store, Slack's API or the model.

* `HttpTransport`: an aiohttp server on `http_host:http_port` serving `POST /slack/events`
  (a bad or stale signature gets bolt's 401 and nothing is stored).
* `SocketTransport`: slack_sdk's aiohttp Socket Mode client (it reconnects by itself);
  the ack is sent on the websocket once the envelope is journaled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from bot.runtime.killpoints import kill_point

from .events import Identity
from .web import SlackWeb

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
MAX_BODY = 1_000_000  # bytes; Slack's event payloads are far smaller


class _NoEnvTokenWarning(logging.Filter):
    """Bolt reads $SLACK_BOT_TOKEN by itself and warns that our client wins over it; the
    token is ours (from the config's env var), handed over through `authorize`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


bolt_log = logging.getLogger("connectors.slack.bolt")
bolt_log.addFilter(_NoEnvTokenWarning())


def build_app(web_api: SlackWeb, *, signing_secret: str | None, identity: Callable[[], Identity],
              on_event: Callable[[dict], Awaitable[None]]) -> AsyncApp:
    async def authorize(**_: object) -> AuthorizeResult:
        me = identity()
        return AuthorizeResult(enterprise_id=None, team_id=me.team, bot_token=web_api.token,
                               bot_id=me.bot_id, bot_user_id=me.user_id)

    app = AsyncApp(client=web_api.bare_client(), signing_secret=signing_secret,
                   authorize=authorize, process_before_response=True,
                   request_verification_enabled=signing_secret is not None,
                   name="steward", logger=bolt_log)

    async def take_events(body: dict, next: Callable[[], Awaitable[None]]):  # noqa: A002
        if body.get("type") != "event_callback":
            return await next()
        await on_event(body)
        return BoltResponse(status=200, body="")

    app.use(take_events)
    return app


class HttpTransport:
    def __init__(self, app: AsyncApp, host: str, port: int):
        self.app = app
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        server = web.Application(client_max_size=MAX_BODY)
        server.router.add_post(EVENTS_PATH, self._handle)
        self._runner = web.AppRunner(server, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the real one when 0 was asked for
        log.info("slack: Events API on http://%s:%d%s", self.host, self.port, EVENTS_PATH)

    async def _handle(self, request: web.Request) -> web.Response:
        bolt_request = AsyncBoltRequest(body=await request.text(), query=request.query_string,
                                        headers=dict(request.headers))
        response = await to_aiohttp_response(await self.app.async_dispatch(bolt_request))
        await response.prepare(request)
        await response.write_eof()  # the ack is on its way to Slack
        kill_point("slack-acked", "slack")
        return response

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class SocketTransport:
    def __init__(self, app: AsyncApp, app_token: str, web_api: SlackWeb):
        self.app = app
        self.app_token = app_token
        self.web_api = web_api
        self._handler: AsyncSocketModeHandler | None = None

    async def start(self) -> None:
        # a client of its own: this runs on the ack loop, the shared session lives elsewhere
        self._handler = AsyncSocketModeHandler(self.app, self.app_token,
                                               web_client=self.web_api.bare_client())
        await self._handler.connect_async()
        log.info("slack: connected in Socket Mode")

    async def stop(self) -> None:
        if self._handler is not None:
            await self._handler.close_async()
            self._handler = None
