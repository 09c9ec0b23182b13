"""How events reach Steward: slack-bolt's AsyncApp in front, in either mode.

Bolt runs its built-in middleware (the signing-secret check with its five-minute
timestamp window in HTTP mode, url_verification, ssl_check, dropping Steward's own
events); then one middleware of ours takes every `event_callback`, journals it and answers
200; an event that could not be journaled (a full disk) is not acknowledged: a 503 in HTTP
mode, no ack in Socket Mode, and Slack sends it again. Nothing else happens before the
ack, and all of it runs on the connector's ack loop (`ackloop.py`): processing runs
afterwards in the lanes on the agent's loop, so the ack never waits for the store, Slack's
API or the model. A click on a button (`block_actions`)
is the exception: Slack never sends it again, so it is applied before its ack (one
commit, see `actions.py`), and a click that could not be gets a 503.

* `HttpTransport`: an aiohttp server on `http_host:http_port` serving `POST /slack/events`
  (a bad or stale signature gets a 401 and nothing is stored). What bolt's parsing would
  raise on is answered before bolt sees it, never with a 500 and a traceback: signature
  headers that cannot be checked (none, a timestamp that is no number of seconds) and a
  bad signature get a 401; a body that is not UTF-8, or, signed, is not a JSON object with
  an object for its `event`, gets a 400.
* `SocketTransport`: slack_sdk's aiohttp Socket Mode client (it reconnects by itself);
  the ack is sent on the websocket once the envelope is journaled. Each connection after
  the first (a reconnect: Slack sent nothing meanwhile) is told to `on_reconnect`, which
  reads what was said in between (`catchup.py`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.adapter.socket_mode.aiohttp import AsyncSocketModeHandler
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.authorization import AuthorizeResult
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.signature import SignatureVerifier

from bot.runtime.killpoints import kill_point

from .events import Identity
from .web import SlackWeb

log = logging.getLogger(__name__)

EVENTS_PATH = "/slack/events"
MAX_BODY = 1_000_000  # bytes; Slack's event payloads are far smaller
_SECONDS = re.compile(r"[0-9]{1,15}")  # X-Slack-Request-Timestamp: Unix time in seconds


class _NoEnvTokenWarning(logging.Filter):
    """Bolt reads $SLACK_BOT_TOKEN by itself and warns that our client wins over it; the
    token is ours (from the config's env var), handed over through `authorize`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`token` will be unused" not in record.getMessage()


bolt_log = logging.getLogger("connectors.slack.bolt")
bolt_log.addFilter(_NoEnvTokenWarning())


def build_app(web_api: SlackWeb, *, signing_secret: str | None, identity: Callable[[], Identity],
              on_event: Callable[[dict], Awaitable[bool]],
              on_action: Callable[[dict], Awaitable[bool]]) -> AsyncApp:
    async def authorize(**_: object) -> AuthorizeResult:
        me = identity()
        return AuthorizeResult(enterprise_id=None, team_id=me.team, bot_token=web_api.token,
                               bot_id=me.bot_id, bot_user_id=me.user_id)

    app = AsyncApp(client=web_api.bare_client(), signing_secret=signing_secret,
                   authorize=authorize, process_before_response=True,
                   request_verification_enabled=signing_secret is not None,
                   name="steward", logger=bolt_log)

    async def take_events(body: dict, next: Callable[[], Awaitable[None]]):  # noqa: A002
        if body.get("type") == "block_actions":  # a button: applied before the ack
            return BoltResponse(status=200 if await on_action(body) else 503, body="")
        if body.get("type") != "event_callback":
            return await next()
        if not await on_event(body):  # not journaled: Slack must send it again
            return BoltResponse(status=503, body="")
        return BoltResponse(status=200, body="")

    app.use(take_events)
    return app


class HttpTransport:
    def __init__(self, app: AsyncApp, host: str, port: int, signing_secret: str):
        self.app = app
        self.host = host
        self.port = port
        self.verifier = SignatureVerifier(signing_secret)
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
        body = await self._checked(request)
        if isinstance(body, web.Response):
            return body
        try:
            bolt_request = AsyncBoltRequest(body=body, query=request.query_string,
                                            headers=dict(request.headers))
        except Exception as exc:  # a signed body bolt cannot parse (a form, say)
            log.warning("slack: refused a signed request bolt cannot read: %s", exc)
            return web.Response(status=400, text="the body is not a Slack payload")
        response = await to_aiohttp_response(await self.app.async_dispatch(bolt_request))
        await response.prepare(request)
        await response.write_eof()  # the ack is on its way to Slack
        kill_point("slack-acked", "slack")
        return response

    async def _checked(self, request: web.Request) -> str | web.Response:
        """The body of a signed request that bolt can take, or the answer to one that must
        not reach it: bolt's parsing and middleware raise (a 500 and a traceback) on what
        Slack never sends. The signature is checked here first; bolt checks it again."""
        timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
        signature = request.headers.get("X-Slack-Signature", "")
        if not _SECONDS.fullmatch(timestamp) or not signature:
            log.info("slack: refused a request without a usable signature")
            return web.Response(status=401, text="invalid request signature")
        try:
            body = (await request.read()).decode("utf-8")
        except UnicodeDecodeError:
            log.info("slack: refused a request whose body is not UTF-8")
            return web.Response(status=400, text="the body is not UTF-8")
        if not self.verifier.is_valid(body, timestamp, signature):
            log.info("slack: refused a request with a bad or stale signature")
            return web.Response(status=401, text="invalid request signature")
        if request.content_type == "application/json" or body.startswith("{"):  # as bolt
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            event = payload.get("event") if isinstance(payload, dict) else None
            if not isinstance(payload, dict) or not isinstance(event, dict | None):
                log.warning("slack: refused a signed request whose body is no Slack payload")
                return web.Response(status=400, text="the body is not a Slack payload")
        return body

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class SocketTransport:
    def __init__(self, app: AsyncApp, app_token: str, web_api: SlackWeb,
                 on_reconnect: Callable[[], None] = lambda: None):
        self.app = app
        self.app_token = app_token
        self.web_api = web_api
        self.on_reconnect = on_reconnect  # called on the ack loop
        self._handler: AsyncSocketModeHandler | None = None
        self._hellos = 0

    async def start(self) -> None:
        # a client of its own: this runs on the ack loop, the shared session lives elsewhere
        self._handler = AsyncSocketModeHandler(self.app, self.app_token,
                                               web_client=self.web_api.bare_client())
        self._handler.client.message_listeners.append(self._hello)
        await self._handler.connect_async()
        log.info("slack: connected in Socket Mode")

    async def _hello(self, _client: object, message: dict, _raw: str | None) -> None:
        """Slack's greeting on each new connection; after the first, a reconnect."""
        if message.get("type") != "hello":
            return
        self._hellos += 1
        if self._hellos > 1:
            self.on_reconnect()

    async def stop(self) -> None:
        if self._handler is not None:
            await self._handler.close_async()
            self._handler = None
