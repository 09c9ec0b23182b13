"""A fake LLM provider over real HTTP on 127.0.0.1 (port 0), speaking both wire formats.

    POST /v1/chat/completions   OpenAI-compatible SSE ("openai")
    POST /v1/messages           Anthropic Messages SSE ("anthropic")
    GET  /api/tags              Ollama's model list (from `.tags`; 404 when None)

A test sets `server.responder = fn(request_json, wire) -> Reply` (or `replies(...)` for a
fixed sequence); the default answers "ok". Every request is recorded in `.requests`, but
for the questions Steward asks a server about its model at start (`PROBES`: llama.cpp's
/props, Ollama's /api/show and /api/ps, /v1/models; bot/llm/discovery.py), answered 404
as by a server that does not say, and kept in `.probes`.

Images are checked as the providers check them: OpenAI `image_url` parts with a base64
`data:` URL, Anthropic `image` blocks with a base64 source, in user messages only, of a
supported type whose bytes really are that type; anything else is a 400. `images(r)` gives
the (media type, bytes) of a recorded request's images, in order.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WIRES = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}
PROBES = ("/props", "/v1/models", "/api/show", "/api/ps")


@dataclass
class Reply:
    text: str = ""
    # (id, name, args): args is a dict, or a str sent as is (to send bad JSON)
    tool_calls: list[tuple[str, str, dict | str]] = field(default_factory=list)
    status: int = 200  # non-200: a JSON error body in the provider's format
    headers: dict[str, str] = field(default_factory=dict)
    error_body: dict | None = None  # the error body to send instead of the default one
    chunk_chars: int = 5
    delay: float = 0.0  # seconds between SSE events
    cut_after: int | None = None  # close after N events, before the terminal ones
    usage: tuple[int, int] = (11, 7)  # (input, output) tokens
    cache_read: int = 0
    cost: float | None = None  # OpenRouter-style usage.cost (OpenAI wire only)
    stream_error: dict | None = None  # an error event sent in place of the ending
    model: str = "fake-model"


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: Any


Responder = Callable[[dict, str], Reply]
IMAGE_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff",
               "image/gif": b"GIF8", "image/webp": b"RIFF"}


class BadImage(ValueError):
    pass


def images(recorded: Recorded) -> list[tuple[str, bytes]]:
    """The images a recorded request carried: (media type, bytes), in message order."""
    wire = WIRES.get(recorded.path)
    return _images(recorded.body, wire) if wire and isinstance(recorded.body, dict) else []


def _images(body: dict, wire: str) -> list[tuple[str, bytes]]:
    found = []
    for message in body.get("messages") or []:
        content = message.get("content")
        for part in content if isinstance(content, list) else []:
            kind = part.get("type")
            if wire == "openai" and kind == "image_url":
                url = (part.get("image_url") or {}).get("url", "")
                head, _, data = url.partition(",")
                if not head.startswith("data:") or not head.endswith(";base64"):
                    raise BadImage(f"not a base64 data URL: {url[:40]}")
                found.append(_image(message, head[5:-7], data))
            elif wire == "anthropic" and kind == "image":
                source = part.get("source") or {}
                if source.get("type") != "base64":
                    raise BadImage(f"image source type {source.get('type')!r}")
                found.append(_image(message, source.get("media_type", ""), source.get("data", "")))
    return found


def _image(message: dict, media_type: str, data: str) -> tuple[str, bytes]:
    if message.get("role") != "user":
        raise BadImage("images are allowed in user messages only")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise BadImage("the image data is not base64") from None
    if media_type not in IMAGE_MAGIC or not raw.startswith(IMAGE_MAGIC[media_type]):
        raise BadImage(f"the image is not {media_type}")
    return media_type, raw


def replies(*items: Reply) -> Responder:
    """A responder answering with `items` in order, then repeating the last one."""
    queue = list(items)
    lock = threading.Lock()

    def responder(_request: dict, _wire: str) -> Reply:
        with lock:
            return queue.pop(0) if len(queue) > 1 else queue[0]

    return responder


class FakeLLMServer:
    def __init__(self, responder: Responder | None = None) -> None:
        self.responder: Responder = responder or (lambda _request, _wire: Reply(text="ok"))
        self.tags: list[str] | None = None
        self._requests: list[Recorded] = []
        self.probes: list[Recorded] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the server first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self._requests)

    def count(self, path: str) -> int:
        return sum(1 for r in self.requests if r.path == path)

    def record(self, entry: Recorded) -> None:
        with self._lock:
            (self.probes if entry.path in PROBES else self._requests).append(entry)

    def start(self) -> FakeLLMServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> FakeLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    fake: FakeLLMServer
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet tests
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.fake.record(Recorded("GET", self.path, _lower(self.headers), None))
        tags = self.fake.tags
        if self.path == "/api/tags" and tags is not None:
            self._json(200, {"models": [{"name": t, "model": t} for t in tags]}, {})
        else:
            self._json(404, {"error": "not found"}, {})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = raw.decode("utf-8", "replace")
        self.fake.record(Recorded("POST", self.path, _lower(self.headers), body))
        wire = WIRES.get(self.path)
        if wire is None:
            self._json(404, {"error": {"message": f"no route {self.path}"}}, {})
            return
        try:
            _images(body if isinstance(body, dict) else {}, wire)
        except BadImage as exc:
            self._json(400, _error_body(wire, 400, str(exc)), {})
            return
        reply = self.fake.responder(body, wire)
        if reply.status != 200:
            self._json(reply.status, reply.error_body or _error_body(wire, reply.status),
                       reply.headers)
            return
        events = list(_openai_events(reply) if wire == "openai" else _anthropic_events(reply))
        self._stream(events, reply, terminal=3 if wire == "openai" else 2)

    def _json(self, status: int, body: Any, headers: dict[str, str]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, events: list[str], reply: Reply, terminal: int) -> None:
        """Write SSE events one by one, flushed; `terminal` is how many final events end the
        stream properly (left out on a cut, replaced by the error on `stream_error`)."""
        if reply.cut_after is not None:
            events = events[:min(reply.cut_after, len(events) - terminal)]
        elif reply.stream_error is not None:
            events = events[:len(events) - terminal] + [_sse("error", reply.stream_error)]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        try:
            for i, event in enumerate(events):
                if i and reply.delay:
                    time.sleep(reply.delay)
                self.wfile.write(event.encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)
        self.close_connection = True


def _lower(headers: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _sse(event: str | None, data: Any) -> str:
    text = data if isinstance(data, str) else json.dumps(data)
    return (f"event: {event}\n" if event else "") + f"data: {text}\n\n"


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), max(1, size))]


def _args_text(args: dict | str) -> str:
    return args if isinstance(args, str) else json.dumps(args)


def _error_body(wire: str, status: int, message: str = "") -> dict:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            529: "overloaded_error"}.get(status, "api_error")
    message = message or f"fake {kind} ({status})"
    if wire == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "code": None, "param": None}}


def _openai_events(reply: Reply) -> Iterator[str]:
    """Text deltas, tool calls (starts first, then argument pieces interleaved across calls),
    then the terminal three: finish_reason, usage, [DONE]."""
    def chunk(delta: dict, finish: str | None = None) -> str:
        return _sse(None, {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                           "model": reply.model, "choices": [
                               {"index": 0, "delta": delta, "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(reply.text, reply.chunk_chars):
        yield chunk({"content": piece})
    args = [_pieces(_args_text(a), reply.chunk_chars) for _, _, a in reply.tool_calls]
    for i, (call_id, name, _) in enumerate(reply.tool_calls):
        yield chunk({"tool_calls": [{"index": i, "id": call_id, "type": "function",
                                     "function": {"name": name, "arguments": ""}}]})
    for round_ in range(max((len(a) for a in args), default=0)):
        for i, pieces in enumerate(args):
            if round_ < len(pieces):
                yield chunk({"tool_calls": [{"index": i,
                                             "function": {"arguments": pieces[round_]}}]})
    yield chunk({}, "tool_calls" if reply.tool_calls else "stop")
    yield _sse(None, {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                      "model": reply.model, "choices": [], "usage": {
                          "prompt_tokens": reply.usage[0], "completion_tokens": reply.usage[1],
                          "total_tokens": sum(reply.usage),
                          "prompt_tokens_details": {"cached_tokens": reply.cache_read},
                          **({} if reply.cost is None else {"cost": reply.cost})}})
    yield _sse(None, "[DONE]")


def _anthropic_events(reply: Reply) -> Iterator[str]:
    """message_start, ping, a text block, tool_use blocks with input in pieces, then the
    terminal two: message_delta, message_stop."""
    yield _sse("message_start", {"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": reply.model,
        "content": [], "stop_reason": None, "usage": {
            "input_tokens": reply.usage[0], "output_tokens": 1,
            "cache_read_input_tokens": reply.cache_read, "cache_creation_input_tokens": 0}}})
    yield _sse("ping", {"type": "ping"})
    index = 0
    if reply.text:
        yield _sse("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}})
        for piece in _pieces(reply.text, reply.chunk_chars):
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                               "delta": {"type": "text_delta", "text": piece}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        index = 1
    for call_id, name, args in reply.tool_calls:
        yield _sse("content_block_start", {"type": "content_block_start", "index": index,
                                           "content_block": {"type": "tool_use", "id": call_id,
                                                             "name": name, "input": {}}})
        for piece in _pieces(_args_text(args), reply.chunk_chars):
            yield _sse("content_block_delta", {
                "type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": piece}})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        index += 1
    stop = "tool_use" if reply.tool_calls else "end_turn"
    yield _sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": reply.usage[1]}})
    yield _sse("message_stop", {"type": "message_stop"})
