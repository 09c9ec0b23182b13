"""A fake Slack over real HTTP on 127.0.0.1 (port 0), for the real slack_sdk to talk to.

    /api/<method>      the Web API (`url` is the `api_base_url`): auth.test,
                       apps.connections.open, chat.postMessage|update|delete,
                       conversations.history|replies|open, reactions.add|remove,
                       users.info, users.conversations
    /files/<id>/<name> a file's `url_private` (needs the bot token)
    /socket            the Socket Mode websocket: as Slack does, `push()` sends an envelope
                       to one of the open connections (round-robin over them), and an
                       Events API envelope not acked within `socket.ack_timeout` seconds
                       is sent again (a new envelope id, `retry_attempt` + 1, reason
                       "timeout"), to the next connection, up to `socket.retries` times;
                       acks are kept, and what went where (`socket.deliveries`);
                       `lose_acks(n)`: the next n acks of such envelopes never arrive

Every Web API call is recorded (`calls`, `count`); `fail(method, status, times)` answers
the next calls with 429 (with Retry-After), a 5xx, or `DROP` (the connection is closed with
no answer), optionally after doing the call (`after`: a lost response) and then going down
(`down`). `down()` / `up()`: Slack is unreachable (connections refused, requests on open
connections dropped unanswered) until `up()`; `heal()` forgets pending failures. Messages
are kept per channel, threads included (`slack_workspace.py`), so a test can say "exactly
one visible answer per user message". The server runs its own event loop in a thread, so
in-process connectors and `steward` subprocesses alike can use it. Events are built by
`tests.fakes.slack_events`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import WSMsgType, web

from tests.fakes.slack_workspace import BOT_ID, BOT_USER, TEAM, Workspace, is_user_id

__all__ = ["APP_TOKEN", "BOT_ID", "BOT_TOKEN", "BOT_USER", "DROP", "TEAM", "FakeSlack"]

BOT_TOKEN = "xoxb-fake-bot-token"
APP_TOKEN = "xapp-fake-app-token"
DROP = 0  # a `fail` status: close the connection without an answer


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    status: int
    at: float


@dataclass
class Failure:
    status: int
    times: int
    retry_after: int = 1
    after: bool = False  # do the call, then answer with the error (a lost response)
    down: bool = False  # and then Slack goes down, until `up()`


@dataclass
class Delivery:
    first: str  # the envelope id of the first delivery
    envelope_id: str
    connection: int | None  # the connection's number (in order of connecting); None: none open
    retry_attempt: int
    at: float


@dataclass
class SocketState:
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    acks: dict[str, float] = field(default_factory=dict)  # by envelope id (and first id)
    connects: int = 0
    ack_timeout: float = 3.0  # Slack waits 3 s for an ack, then sends the envelope again
    retries: int = 3  # times an unacked Events API envelope is sent again
    deliveries: list[Delivery] = field(default_factory=list)
    numbers: dict[int, int] = field(default_factory=dict)  # id(ws) -> its number
    first_of: dict[str, str] = field(default_factory=dict)  # envelope id -> first id
    unacked: dict[str, tuple[dict, float]] = field(default_factory=dict)  # first id ->
    # (the envelope last sent, when)
    turn: int = 0  # the round-robin's position
    lose: int = 0  # acks still to lose (`lose_acks`)
    lost: list[str] = field(default_factory=list)  # envelope ids whose ack was lost


class FakeSlack(Workspace):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []
        self.socket = SocketState()
        self._failures: dict[str, list[Failure]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._down = False
        self._thread: threading.Thread | None = None
        self._retrying: asyncio.Task | None = None

    # -- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The Web API base URL (`[slack] api_base_url`)."""
        return f"http://127.0.0.1:{self.port}/api/"

    def start(self) -> FakeSlack:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake Slack did not start")
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeSlack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_get("/files/{file_id}/{name}", self._file)
        app.router.add_get("/socket", self._socket)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(self._site.start())
        self.port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._retrying = loop.create_task(self._retry_unacked())
        ready.set()
        loop.run_forever()
        loop.close()

    async def _shutdown(self) -> None:
        if self._retrying is not None:
            self._retrying.cancel()
        for ws in list(self.socket.sockets):
            await ws.close()
        assert self._runner is not None
        await self._runner.cleanup()

    # -- what tests use ------------------------------------------------------------

    def fail(self, method: str, status: int = 429, times: int = 1, retry_after: int = 1, *,
             after: bool = False, down: bool = False) -> None:
        """Answer the next `times` calls of `method` with `status` (429 with Retry-After,
        a 5xx, or DROP: no answer at all); `after`: the call takes effect all the same,
        only its answer is lost; `down`: then Slack is unreachable until `up()`."""
        with self._lock:
            self._failures.setdefault(method, []).append(
                Failure(status, times, retry_after, after, down))

    def heal(self, method: str | None = None) -> None:
        """Forget the failures still pending (of one method, or all)."""
        with self._lock:
            if method is None:
                self._failures.clear()
            else:
                self._failures.pop(method, None)

    def down(self) -> None:
        """Slack is unreachable: new connections are refused, requests on connections
        already open are dropped without an answer (and without effect)."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._go_down(), self._loop).result(5)

    def up(self) -> None:
        """Slack answers again, on the same port."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._go_up(), self._loop).result(5)

    @property
    def is_down(self) -> bool:
        return self._down

    async def _go_down(self) -> None:
        if self._down:
            return
        self._down = True
        assert self._site is not None
        await self._site.stop()

    async def _go_up(self) -> None:
        if not self._down:
            return
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await self._site.start()
        self._down = False

    def count(self, method: str, *, ok_only: bool = False) -> int:
        with self._lock:
            return sum(1 for c in self.calls if c.method == method
                       and (not ok_only or c.status == 200))

    def calls_of(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def push(self, payload: dict, *, envelope_type: str = "events_api",
             retry_attempt: int = 0) -> str:
        """Send an envelope to one connected Socket Mode client (the next, round-robin);
        its id. An Events API envelope is sent again until acked (see the module's doc)."""
        envelope_id = str(uuid.uuid4())
        envelope = {"envelope_id": envelope_id, "type": envelope_type, "payload": payload,
                    "accepts_response_payload": False, "retry_attempt": retry_attempt,
                    "retry_reason": "timeout" if retry_attempt else ""}
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._deliver(envelope_id, envelope),
                                         self._loop).result(5)
        return envelope_id

    def disconnect_sockets(self) -> None:
        """Ask Socket Mode clients to reconnect, as Slack does now and then."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._send_all(
            {"type": "disconnect", "reason": "refresh_requested"}), self._loop).result(5)

    def connected(self) -> int:
        with self._lock:
            return sum(1 for ws in self.socket.sockets if not ws.closed)

    def acked(self, envelope_id: str) -> float | None:
        """When the envelope (or, for the first one's id, any of its retries) was acked."""
        with self._lock:
            return self.socket.acks.get(envelope_id)

    def lose_acks(self, times: int = 1) -> None:
        """The next `times` acks of Events API envelopes are lost on the way (or come too
        late): Slack sends those envelopes again, to the next connection."""
        with self._lock:
            self.socket.lose += times

    def unacked(self) -> int:
        """Events API envelopes still waiting for an ack (to be sent again)."""
        with self._lock:
            return len(self.socket.unacked)

    # -- Web API -------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        if self._down:  # a connection opened before Slack went down
            return self._drop(request)
        params: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            raw = await request.read()
            if request.content_type == "application/json":
                params.update(json.loads(raw or b"{}"))
            else:
                params.update(parse_qsl(raw.decode()))
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        status, headers, body, down = self._answer(method, params, token)
        with self._lock:
            self.calls.append(Call(method, params, status, time.time()))
        if down:
            await self._go_down()
        if status == DROP:
            return self._drop(request)
        return web.json_response(body, status=status, headers=headers)

    @staticmethod
    def _drop(request: web.Request) -> web.StreamResponse:
        """Close the connection without an answer (the client sees it dropped)."""
        assert request.transport is not None
        request.transport.abort()
        return web.Response(status=599)  # never reaches the client

    def _answer(self, method: str, params: dict, token: str
                ) -> tuple[int, dict, dict, bool]:
        """(status, headers, body, whether Slack goes down after this call)."""
        with self._lock:
            queue = self._failures.get(method) or []
            failure = queue[0] if queue else None
            if failure is None:
                return 200, {}, self._call(method, params, token), False
            failure.times -= 1
            if failure.times <= 0:
                queue.pop(0)
            if failure.after:
                self._call(method, params, token)
            if failure.status == 429:
                return 429, {"Retry-After": str(failure.retry_after)}, {
                    "ok": False, "error": "ratelimited"}, failure.down
            return failure.status, {}, {"ok": False, "error": "internal_error"}, failure.down

    def _call(self, method: str, params: dict, token: str) -> dict:
        wanted = APP_TOKEN if method == "apps.connections.open" else BOT_TOKEN
        if token != wanted:
            return {"ok": False, "error": "invalid_auth"}
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if is_user_id(str(params.get("channel", ""))) and method != "conversations.open":
            # A person's id is not a conversation: their DM's id comes from
            # conversations.open (users=U...).
            return {"ok": False, "error": "channel_not_found"}
        if handler is None:
            return {"ok": False, "error": "unknown_method"}
        return handler(params)

    # -- files and Socket Mode -----------------------------------------------------

    async def _file(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        with self._lock:
            self.calls.append(Call("files.download", {"id": request.match_info["file_id"]},
                                   200, time.time()))
            found = self.files.get(request.match_info["file_id"])
        if token != BOT_TOKEN or found is None:
            return web.Response(status=404 if found is None else 403, text="no")
        return web.Response(body=found[1], content_type=found[0]["mimetype"])

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        with self._lock:
            self.socket.sockets.append(ws)
            self.socket.connects += 1
            self.socket.numbers[id(ws)] = self.socket.connects
            count = sum(1 for s in self.socket.sockets if not s.closed)
        await ws.send_str(json.dumps({"type": "hello", "num_connections": count,
                                      "connection_info": {"app_id": "A0FAKE"},
                                      "debug_info": {"host": "fake"}}))
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                data = json.loads(msg.data)
                if data.get("envelope_id"):
                    with self._lock:
                        envelope_id = data["envelope_id"]
                        first = self.socket.first_of.get(envelope_id, envelope_id)
                        if self.socket.lose > 0 and first in self.socket.unacked:
                            self.socket.lose -= 1
                            self.socket.lost.append(envelope_id)
                            continue
                        self.socket.acks.setdefault(envelope_id, time.time())
                        self.socket.acks.setdefault(first, time.time())
                        self.socket.unacked.pop(first, None)
        with self._lock:
            self.socket.sockets.remove(ws)
        return ws

    async def _deliver(self, first: str, envelope: dict) -> None:
        """To the next open connection; an Events API envelope waits for its ack."""
        with self._lock:
            self.socket.first_of[envelope["envelope_id"]] = first
            if envelope["type"] == "events_api":
                self.socket.unacked[first] = (envelope, time.monotonic())
            open_ = [ws for ws in self.socket.sockets if not ws.closed]
            ws = open_[self.socket.turn % len(open_)] if open_ else None
            self.socket.turn += 1
            self.socket.deliveries.append(Delivery(
                first, envelope["envelope_id"],
                None if ws is None else self.socket.numbers[id(ws)],
                envelope["retry_attempt"], time.time()))
        if ws is not None:
            try:
                await ws.send_str(json.dumps(envelope))
            except (ConnectionError, RuntimeError):  # it went: the retry goes elsewhere
                pass

    async def _retry_unacked(self) -> None:
        """Slack sends an Events API envelope again when no ack came in time."""
        while True:
            await asyncio.sleep(0.1)
            due = []
            with self._lock:
                for first, (envelope, sent) in list(self.socket.unacked.items()):
                    if time.monotonic() - sent < self.socket.ack_timeout:
                        continue
                    if envelope["retry_attempt"] >= self.socket.retries:
                        del self.socket.unacked[first]  # Slack gives up on it
                        continue
                    due.append((first, {
                        **envelope, "envelope_id": str(uuid.uuid4()),
                        "retry_attempt": envelope["retry_attempt"] + 1,
                        "retry_reason": "timeout"}))
            for first, envelope in due:
                await self._deliver(first, envelope)

    async def _send_all(self, message: dict) -> None:
        text = json.dumps(message)
        for ws in list(self.socket.sockets):
            if not ws.closed:
                await ws.send_str(text)


