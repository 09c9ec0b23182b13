"""A fake Slack over real HTTP on 127.0.0.1 (port 0), for the real slack_sdk to talk to.

    /api/<method>      the Web API (`url` is the `api_base_url`): auth.test,
                       apps.connections.open, chat.postMessage|update|delete,
                       conversations.history|replies, reactions.add|remove, users.info
    /files/<id>/<name> a file's `url_private` (needs the bot token)
    /socket            the Socket Mode websocket (`push()` sends an envelope, acks are kept)

Every Web API call is recorded (`calls`, `count`); `fail(method, status, times)` answers
the next calls with 429 (with Retry-After) or 500. Messages are kept per channel, threads
included, so a test can say "exactly one visible answer per user message". The server runs
its own event loop in a thread, so in-process connectors and `steward` subprocesses alike
can use it. Envelopes and events are built by `tests.fakes.slack_events`.
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

BOT_TOKEN = "xoxb-fake-bot-token"
APP_TOKEN = "xapp-fake-app-token"
TEAM = "T0FAKE"
BOT_USER = "U0STEWARD"
BOT_ID = "B0STEWARD"


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


@dataclass
class SocketState:
    sockets: list[web.WebSocketResponse] = field(default_factory=list)
    acks: dict[str, float] = field(default_factory=dict)
    connects: int = 0


class FakeSlack:
    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.messages: dict[str, list[dict]] = {}  # channel -> messages in ts order
        self.files: dict[str, tuple[dict, bytes]] = {}
        self.users: dict[str, dict] = {}
        self.socket = SocketState()
        self._failures: dict[str, list[Failure]] = {}
        self._tick = 0
        self._base = int(time.time()) - 100_000
        self._lock = threading.RLock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

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
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        loop.run_forever()
        loop.close()

    async def _shutdown(self) -> None:
        for ws in list(self.socket.sockets):
            await ws.close()
        assert self._runner is not None
        await self._runner.cleanup()

    # -- what tests use ------------------------------------------------------------

    def next_ts(self) -> str:
        with self._lock:
            self._tick += 1
            return f"{self._base + self._tick // 1000}.{self._tick % 1000:03d}100"

    def fail(self, method: str, status: int = 429, times: int = 1, retry_after: int = 1):
        """Answer the next `times` calls of `method` with `status`."""
        with self._lock:
            self._failures.setdefault(method, []).append(Failure(status, times, retry_after))

    def count(self, method: str, *, ok_only: bool = False) -> int:
        with self._lock:
            return sum(1 for c in self.calls if c.method == method
                       and (not ok_only or c.status == 200))

    def calls_of(self, method: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.method == method]

    def history(self, channel: str) -> list[dict]:
        """Every message of a channel, threads included, oldest first (copies)."""
        with self._lock:
            return [dict(m) for m in self.messages.get(channel, [])]

    def bot_messages(self, channel: str, thread_ts: str | None = None) -> list[dict]:
        return [m for m in self.history(channel) if m.get("bot_id") == BOT_ID
                and (thread_ts is None or m.get("thread_ts") == thread_ts)]

    def add_message(self, channel: str, message: dict) -> dict:
        """Put a message into a channel as Slack would have it (`ts` assigned if absent)."""
        with self._lock:
            message = {"type": "message", **message}
            message.setdefault("ts", self.next_ts())
            self.messages.setdefault(channel, []).append(message)
            self.messages[channel].sort(key=lambda m: float(m["ts"]))
            thread = message.get("thread_ts")
            if thread and thread != message["ts"]:
                for m in self.messages[channel]:
                    if m["ts"] == thread:
                        m["reply_count"] = m.get("reply_count", 0) + 1
                        m.setdefault("thread_ts", thread)
            return dict(message)

    def edit_message(self, channel: str, ts: str, text: str) -> tuple[dict, dict]:
        """Change a message's text as its author would: (previous, new)."""
        with self._lock:
            m = self._find(channel, ts)
            previous = dict(m)
            m["text"] = text
            m["edited"] = {"user": m.get("user"), "ts": self.next_ts()}
            return previous, dict(m)

    def delete_message(self, channel: str, ts: str) -> dict:
        with self._lock:
            m = self._find(channel, ts)
            self.messages[channel].remove(m)
            return m

    def add_file(self, name: str, content: bytes, mimetype: str = "text/plain",
                 filetype: str = "text") -> dict:
        file_id = "F" + uuid.uuid4().hex[:10].upper()
        info = {"id": file_id, "name": name, "title": name, "mimetype": mimetype,
                "filetype": filetype, "size": len(content), "mode": "hosted",
                "url_private": f"http://127.0.0.1:{self.port}/files/{file_id}/{name}",
                "url_private_download":
                    f"http://127.0.0.1:{self.port}/files/{file_id}/{name}?download=1"}
        with self._lock:
            self.files[file_id] = (info, content)
        return dict(info)

    def add_user(self, user: str, name: str, *, is_bot: bool = False) -> None:
        with self._lock:
            self.users[user] = {"id": user, "team_id": TEAM, "name": name.lower(),
                                "real_name": name, "is_bot": is_bot,
                                "profile": {"real_name": name, "display_name": name}}

    def push(self, payload: dict, *, envelope_type: str = "events_api",
             retry_attempt: int = 0) -> str:
        """Send an envelope to every connected Socket Mode client; its id."""
        envelope_id = str(uuid.uuid4())
        envelope = {"envelope_id": envelope_id, "type": envelope_type, "payload": payload,
                    "accepts_response_payload": False, "retry_attempt": retry_attempt,
                    "retry_reason": "timeout" if retry_attempt else ""}
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._send_all(envelope), self._loop).result(5)
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
        with self._lock:
            return self.socket.acks.get(envelope_id)

    # -- Web API -------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: dict[str, Any] = dict(request.query)
        if request.can_read_body:
            raw = await request.read()
            if request.content_type == "application/json":
                params.update(json.loads(raw or b"{}"))
            else:
                params.update(parse_qsl(raw.decode()))
        token = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        status, headers, body = self._answer(method, params, token)
        with self._lock:
            self.calls.append(Call(method, params, status, time.time()))
        return web.json_response(body, status=status, headers=headers)

    def _answer(self, method: str, params: dict, token: str) -> tuple[int, dict, dict]:
        with self._lock:
            queue = self._failures.get(method) or []
            if queue:
                failure = queue[0]
                failure.times -= 1
                if failure.times <= 0:
                    queue.pop(0)
                if failure.status == 429:
                    return 429, {"Retry-After": str(failure.retry_after)}, {
                        "ok": False, "error": "ratelimited"}
                return failure.status, {}, {"ok": False, "error": "internal_error"}
        wanted = APP_TOKEN if method == "apps.connections.open" else BOT_TOKEN
        if token != wanted:
            return 200, {}, {"ok": False, "error": "invalid_auth"}
        handler = getattr(self, "_m_" + method.replace(".", "_"), None)
        if handler is None:
            return 200, {}, {"ok": False, "error": "unknown_method"}
        with self._lock:
            return 200, {}, handler(params)

    def _m_auth_test(self, p: dict) -> dict:
        return {"ok": True, "url": "https://fake.slack.com/", "team": "Fake", "user": "steward",
                "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID, "is_enterprise_install":
                False}

    def _m_apps_connections_open(self, p: dict) -> dict:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket?ticket={uuid.uuid4()}"}

    def _m_chat_postMessage(self, p: dict) -> dict:  # noqa: N802 - Slack's method name
        channel = p.get("channel", "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        message = {"type": "message", "user": BOT_USER, "bot_id": BOT_ID, "app_id": "A0FAKE",
                   "text": p.get("text", ""), "ts": self.next_ts(), "team": TEAM}
        if p.get("thread_ts"):
            message["thread_ts"] = p["thread_ts"]
        metadata = _json_param(p.get("metadata"))
        if metadata:
            message["metadata"] = metadata
        stored = self.add_message(channel, message)
        return {"ok": True, "channel": channel, "ts": stored["ts"],
                "message": {k: v for k, v in stored.items() if k != "metadata"}}

    def _m_chat_update(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("ts", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        if m.get("bot_id") != BOT_ID:
            return {"ok": False, "error": "cant_update_message"}
        m["text"] = p.get("text", "")
        m["edits"] = m.get("edits", 0) + 1
        metadata = _json_param(p.get("metadata"))
        if metadata:
            m["metadata"] = metadata
        return {"ok": True, "channel": p["channel"], "ts": m["ts"], "text": m["text"]}

    def _m_chat_delete(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("ts", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        self.messages[p["channel"]].remove(m)
        return {"ok": True, "channel": p["channel"], "ts": m["ts"]}

    def _m_conversations_history(self, p: dict) -> dict:
        msgs = [m for m in self.messages.get(p.get("channel", ""), [])
                if m.get("thread_ts") in (None, m["ts"])]
        return self._page(list(reversed(msgs)), p)

    def _m_conversations_replies(self, p: dict) -> dict:
        root = p.get("ts", "")
        msgs = [m for m in self.messages.get(p.get("channel", ""), [])
                if m["ts"] == root or m.get("thread_ts") == root]
        if not msgs:
            return {"ok": False, "error": "thread_not_found"}
        return self._page(msgs, p)

    def _page(self, msgs: list[dict], p: dict) -> dict:
        inclusive = str(p.get("inclusive", "0")) in ("1", "true")
        oldest, latest = p.get("oldest"), p.get("latest")
        if oldest:
            msgs = [m for m in msgs if float(m["ts"]) > float(oldest)
                    or (inclusive and m["ts"] == oldest)]
        if latest:
            msgs = [m for m in msgs if float(m["ts"]) < float(latest)
                    or (inclusive and m["ts"] == latest)]
        start = int(p.get("cursor") or 0)
        limit = min(int(p.get("limit") or 100), 1000)
        page = msgs[start:start + limit]
        with_meta = str(p.get("include_all_metadata", "0")) in ("1", "true")
        out = [m if with_meta else {k: v for k, v in m.items() if k != "metadata"}
               for m in (dict(m) for m in page)]
        more = start + limit < len(msgs)
        return {"ok": True, "messages": out, "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}}

    def _m_reactions_add(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("timestamp", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        names = m.setdefault("reactions_by_bot", [])
        if p["name"] in names:
            return {"ok": False, "error": "already_reacted"}
        names.append(p["name"])
        return {"ok": True}

    def _m_reactions_remove(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("timestamp", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        names = m.get("reactions_by_bot", [])
        if p["name"] not in names:
            return {"ok": False, "error": "no_reaction"}
        names.remove(p["name"])
        return {"ok": True}

    def _m_users_info(self, p: dict) -> dict:
        user = self.users.get(p.get("user", ""))
        return {"ok": True, "user": user} if user else {"ok": False, "error": "user_not_found"}

    def _find(self, channel: str, ts: str, missing_ok: bool = False) -> dict | None:
        for m in self.messages.get(channel, []):
            if m["ts"] == ts:
                return m
        if missing_ok:
            return None
        raise KeyError(f"no message {ts} in {channel}")

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
        await ws.send_str(json.dumps({"type": "hello", "num_connections": 1,
                                      "connection_info": {"app_id": "A0FAKE"},
                                      "debug_info": {"host": "fake"}}))
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                data = json.loads(msg.data)
                if data.get("envelope_id"):
                    with self._lock:
                        self.socket.acks.setdefault(data["envelope_id"], time.time())
        with self._lock:
            self.socket.sockets.remove(ws)
        return ws

    async def _send_all(self, message: dict) -> None:
        text = json.dumps(message)
        for ws in list(self.socket.sockets):
            if not ws.closed:
                await ws.send_str(text)


def _json_param(value: Any) -> dict | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None
