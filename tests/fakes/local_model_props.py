"""A fake local model server on 127.0.0.1 (port 0): llama.cpp's `llama-server` or Ollama, as
far as what they say about their model and what they do with a prompt that does not fit.

    llama.cpp  GET  /props              `default_generation_settings.n_ctx`, `n_ctx` (newer
                                        builds), `chat_template`, `chat_template_caps`
               GET  /v1/models          the model with `meta.n_ctx` / `meta.n_ctx_train`
               POST /v1/chat/completions a prompt of n_ctx tokens or more: HTTP 400 with the
                                        body llama.cpp sends (`exceed_context_size_error`,
                                        `n_prompt_tokens`, `n_ctx`); a reply that would run
                                        past the window stops there (finish_reason length)
    Ollama     GET  /api/tags, /api/ps  the models, the loaded one with its `context_length`
               POST /api/show           `model_info["<arch>.context_length"]`, `parameters`
                                        (num_ctx), `capabilities`, `template`
               POST /v1/chat/completions a prompt too long is cut silently from the start,
                                        as Ollama does (`.truncated` counts them)

The shapes are the ones the servers' sources write (llama.cpp tools/server
server-context.cpp `get_res_props`, `get_res_model_info`, server-task.cpp's error; Ollama's
api types). Tokens are counted as a chat template would see them, about four characters
each (`prompt_tokens`); every completion request is kept in `.calls` with its count.

`answer(body) -> str` writes the model's reply (default "ok"); a request whose system
message asks for a running summary gets a summary of the words asked for, cut at
`max_tokens` as a real server would.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHARS_PER_TOKEN = 4
GEMMA_TEMPLATE = ("{{ bos_token }}{% for message in messages %}<start_of_turn>"
                  "{{ message['role'] }}\n{{ message['content'] }}<end_of_turn>\n"
                  "{% endfor %}<start_of_turn>model\n")
TOOLS_TEMPLATE = ("{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}"
                  + GEMMA_TEMPLATE)


def prompt_tokens(body: dict) -> int:
    """The prompt's size as the server counts it: every message's role, text and tool calls
    as the template writes them, and the tool schemas."""
    chars = 0
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        chars += len(str(m.get("role", ""))) + len(content or "") + 24
        chars += len(json.dumps(m.get("tool_calls") or []))
    chars += len(json.dumps(body.get("tools") or []))
    return chars // CHARS_PER_TOKEN + 1


@dataclass
class Call:
    prompt_tokens: int
    max_tokens: int
    summary: bool
    tools: int


class LocalModelServer:
    def __init__(self, kind: str = "llamacpp", *, n_ctx: int = 4096, n_ctx_train: int = 32768,
                 model: str = "gemma-3-270m-it", tools: bool = True, num_ctx: int | None = None,
                 newer: bool = True, answer: Callable[[dict], str] | None = None):
        assert kind in ("llamacpp", "ollama")
        self.kind, self.n_ctx, self.n_ctx_train, self.model = kind, n_ctx, n_ctx_train, model
        self.tools, self.num_ctx, self.newer = tools, num_ctx, newer
        self.answer = answer or (lambda body: "ok")
        self.calls: list[Call] = []
        self.paths: list[str] = []
        self.overflows = 0
        self.truncated = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LocalModelServer:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.05})
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # -- what the servers say about their model -------------------------------------------

    def props(self) -> dict:
        template = TOOLS_TEMPLATE if self.tools else GEMMA_TEMPLATE
        props = {"default_generation_settings": {"n_ctx": self.n_ctx, "params": {
            "n_predict": -1, "temperature": 0.8}}, "total_slots": 1,
            "model_path": f"/models/{self.model}.gguf", "chat_template": template,
            "bos_token": "<bos>", "eos_token": "<eos>", "build_info": "b6000-fake"}
        if self.newer:
            props.update(model_alias=self.model, modalities={"vision": False, "audio": False},
                         chat_template_caps={
                             "supports_tools": self.tools, "supports_tool_calls": self.tools,
                             "supports_system_role": True, "supports_parallel_tool_calls":
                             self.tools, "supports_string_content": True,
                             "supports_typed_content": False}, is_sleeping=False)
        return props

    def models(self) -> dict:
        meta = {"vocab_type": 1, "n_vocab": 262144, "n_ctx_train": self.n_ctx_train,
                "n_embd": 640, "n_params": 268098176, "size": 241410624}
        if self.newer:
            meta["n_ctx"] = self.n_ctx
        return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                            "owned_by": "llamacpp", "meta": meta}]}

    def show(self, name: str) -> tuple[int, dict]:
        if name != self.model:
            return 404, {"error": f"model '{name}' not found"}
        parameters = 'stop "<end_of_turn>"\ntemperature 1'
        if self.num_ctx:
            parameters += f"\nnum_ctx {self.num_ctx}"
        return 200, {
            "modelfile": f"FROM {self.model}\n", "parameters": parameters,
            "template": ("{{- range .Messages }}{{ .Content }}{{ end }}" if not self.tools else
                         "{{- if .Tools }}{{ .Tools }}{{ end }}{{- range .Messages }}"
                         "{{ .Content }}{{ end }}"),
            "details": {"format": "gguf", "family": "gemma3", "parameter_size": "268.10M",
                        "quantization_level": "Q4_K_M"},
            "model_info": {"general.architecture": "gemma3",
                           "gemma3.context_length": self.n_ctx_train,
                           "gemma3.embedding_length": 640},
            "capabilities": ["completion", *(["tools"] if self.tools else [])]}

    def ps(self) -> dict:
        return {"models": [{"name": self.model, "model": self.model, "size": 1,
                            "context_length": self.n_ctx}]}

    # -- a completion ---------------------------------------------------------------------

    def complete(self, body: dict) -> tuple[int, Any]:
        """(status, the error body) or (200, (text, prompt tokens, finish reason))."""
        tokens = prompt_tokens(body)
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        system = next((m.get("content") or "" for m in body.get("messages") or []
                       if m.get("role") == "system"), "")
        summary = "running summary" in system
        with self._lock:
            self.calls.append(Call(tokens, max_tokens, summary, len(body.get("tools") or [])))
        if tokens >= self.n_ctx:
            if self.kind == "ollama":
                with self._lock:
                    self.truncated += 1
                tokens = self.n_ctx - 1
            else:
                with self._lock:
                    self.overflows += 1
                return 400, {"error": {
                    "code": 400, "type": "exceed_context_size_error",
                    "message": f"request ({tokens} tokens) exceeds the available context "
                               f"size ({self.n_ctx} tokens), try increasing it",
                    "n_prompt_tokens": tokens, "n_ctx": self.n_ctx}}
        if summary:
            words = int((re.search(r"under (\d+) words", system) or [0, 200])[1])
            text = "SUMMARY: " + " ".join(f"note{n}" for n in range(words))
        else:
            text = self.answer(body)
        room = self.n_ctx - tokens
        limit = min(max_tokens, room) if max_tokens else room
        finish = "stop"
        if len(text) // CHARS_PER_TOKEN > limit:
            text, finish = text[:limit * CHARS_PER_TOKEN], "length"
        return 200, (text, tokens, finish)


class _Handler(BaseHTTPRequestHandler):
    fake: LocalModelServer
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet tests
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        fake = self.fake
        fake.paths.append(f"GET {self.path}")
        if fake.kind == "llamacpp" and self.path == "/props":
            self._json(200, fake.props())
        elif fake.kind == "llamacpp" and self.path == "/v1/models":
            self._json(200, fake.models())
        elif fake.kind == "ollama" and self.path == "/api/tags":
            self._json(200, {"models": [{"name": fake.model, "model": fake.model}]})
        elif fake.kind == "ollama" and self.path == "/api/ps" and fake.newer:
            self._json(200, fake.ps())
        elif fake.kind == "ollama" and self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": fake.model, "object": "model", "created": 0, "owned_by": "library"}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found",
                                       "type": "not_found_error"}})

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        fake = self.fake
        fake.paths.append(f"POST {self.path}")
        if fake.kind == "ollama" and self.path == "/api/show":
            self._json(*fake.show(body.get("model") or body.get("name") or ""))
        elif self.path == "/v1/chat/completions":
            status, said = fake.complete(body)
            if status != 200:
                self._json(status, said)
                return
            self._stream(*said)
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found",
                                       "type": "not_found_error"}})

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json; charset=utf-8")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, text: str, tokens: int, finish: str) -> None:
        model = self.fake.model

        def chunk(delta: dict, reason: str | None = None) -> str:
            return "data: " + json.dumps({
                "id": "chatcmpl-local", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}) + "\n\n"

        events = [chunk({"role": "assistant", "content": None})]
        events += [chunk({"content": text[i:i + 16]}) for i in range(0, len(text), 16)]
        events.append(chunk({}, finish))
        events.append("data: " + json.dumps({
            "id": "chatcmpl-local", "object": "chat.completion.chunk", "model": model,
            "choices": [], "usage": {
                "prompt_tokens": tokens, "completion_tokens": len(text) // CHARS_PER_TOKEN + 1,
                "total_tokens": tokens + len(text) // CHARS_PER_TOKEN + 1}}) + "\n\n")
        events.append("data: [DONE]\n\n")
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(event.encode())
        self.wfile.flush()
        self.close_connection = True
