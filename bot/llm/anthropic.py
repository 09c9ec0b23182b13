"""Anthropic Messages API, streamed.

Messages: leading system messages become `system`; an assistant's tool calls become
`tool_use` blocks; tool results become `tool_result` blocks (with `is_error`) in a user
message. Consecutive user-side items (tool results, then perhaps a steering message) are
merged into one user message, results first, as the API requires. A later system message
(say, the current time placed late to keep the cache warm) is sent as user text.
Prompt caching: a cache breakpoint on the system prompt and on the last message.
Images: a user message's images follow its text as `image` blocks with a base64 source.

Stream: `message_start` (usage, cache tokens), `content_block_start` (text or tool_use),
`content_block_delta` (text_delta, input_json_delta), `content_block_stop`,
`message_delta` (stop_reason, output usage), `message_stop`; `error` events are raised.
No `message_stop` means the stream was cut: StreamError.

Usage: `input_tokens` counts the whole prompt (Anthropic's input_tokens plus the cache
reads and writes), as for OpenAI; `cache_read_tokens`/`cache_write_tokens` are parts of it.
"""

from __future__ import annotations

from typing import Any

import httpx

from .base import OnText, open_sse, parse_arguments, parse_json_event
from .errors import StreamError
from .http_errors import payload_error
from .types import Message, Request, Response, ToolCall, Usage, image_data, missing_image

_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls",
                 "max_tokens": "length"}
_CACHE = {"type": "ephemeral"}


class AnthropicClient:
    provider = "anthropic"

    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        base_url: str = "https://api.anthropic.com",
        api_key: str | None,
        api_key_env: str = "ANTHROPIC_API_KEY",
        model: str,
        version: str = "2023-06-01",
    ) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.api_key_env = api_key_env
        self.model = model
        self.version = version

    def __repr__(self) -> str:
        return f"AnthropicClient(model={self.model!r}, base_url={self.base_url!r})"

    async def stream(self, request: Request, on_text: OnText | None = None) -> Response:
        headers = {"anthropic-version": self.version}
        if self.api_key:
            headers["x-api-key"] = self.api_key
        assembly = _Assembly(request.model or self.model)
        body = self.wire_body(request, await image_data(request))
        async with open_sse(self.http, f"{self.base_url}/v1/messages",
                            body=body, headers=headers,
                            provider=self.provider, api_key_env=self.api_key_env) as events:
            async for event, data in events:
                payload = parse_json_event(self.provider, data)
                kind = payload.get("type") or event
                if kind == "error":
                    raise payload_error(self.provider, payload.get("error"), self.api_key_env)
                if kind == "message_stop":
                    assembly.done = True
                    break
                text = assembly.add(kind, payload)
                if text and on_text is not None:
                    await on_text(text)
        if not assembly.done:
            raise StreamError(f"{self.provider}: the stream ended before message_stop",
                              provider=self.provider)
        return assembly.response()

    def wire_body(self, request: Request,
                  images: dict[str, str | None] | None = None) -> dict[str, Any]:
        """The JSON body for `request` (public so the exact request can be inspected);
        `images`: the base64 of its images by sha256 (`image_data`), else they are
        named by their stored path."""
        system, messages = wire_messages(request.messages, images)
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": request.max_tokens,
            "messages": messages,
            "stream": True,
        }
        if system:
            body["system"] = [{"type": "text", "text": system, "cache_control": _CACHE}]
        if request.tools:
            body["tools"] = [{"name": t.name, "description": t.description,
                              "input_schema": t.parameters} for t in request.tools]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        return body


def wire_messages(messages: list[Message], images: dict[str, str | None] | None = None
                  ) -> tuple[str, list[dict[str, Any]]]:
    """`(system, messages)` in Messages-API form."""
    rest = list(messages)
    system: list[str] = []
    while rest and rest[0].role == "system":
        system.append(rest.pop(0).content)
    out: list[dict[str, Any]] = []
    for message in rest:
        role = "assistant" if message.role == "assistant" else "user"
        blocks = _blocks(message) + _images(message, images)
        if not blocks:
            continue  # the API rejects empty content
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for message in out:  # tool results first within a user message
        message["content"].sort(key=lambda b: b["type"] != "tool_result")
    if out:
        out[-1]["content"][-1] = {**out[-1]["content"][-1], "cache_control": _CACHE}
    return "\n\n".join(s for s in system if s), out


def _blocks(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id or ""}
        if message.content:
            block["content"] = message.content
        if message.is_error:
            block["is_error"] = True
        return [block]
    text = message.content
    if message.role == "system" and text:
        text = f"<system>{text}</system>"
    blocks: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    if message.role == "assistant":
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                   for c in message.tool_calls]
    return blocks


def _images(message: Message, images: dict[str, str | None] | None) -> list[dict[str, Any]]:
    if message.role != "user":
        return []
    blocks: list[dict[str, Any]] = []
    for image in message.images:
        if images is None:  # inspection only: never sent like this
            source = {"type": "url", "url": f"file://{image.path}"}
        elif images.get(image.sha256) is None:
            blocks.append({"type": "text", "text": missing_image(image)})
            continue
        else:
            source = {"type": "base64", "media_type": image.media_type,
                      "data": images[image.sha256]}
        blocks.append({"type": "image", "source": source})
    return blocks


class _Assembly:
    """The answer, put together event by event."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.text: list[str] = []
        self.blocks: dict[int, dict[str, Any]] = {}  # index -> tool_use block being built
        self.calls: list[ToolCall] = []
        self.stop_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.done = False

    def add(self, kind: str, payload: dict[str, Any]) -> str:
        """Take one event in; return its text delta ("" if none)."""
        if kind == "message_start":
            message = payload.get("message") or {}
            self.model = message.get("model") or self.model
            self._add_usage(message.get("usage"))
        elif kind == "content_block_start":
            block = payload.get("content_block") or {}
            if block.get("type") == "tool_use":
                self.blocks[payload.get("index", 0)] = {**block, "json": []}
            elif block.get("type") == "text" and block.get("text"):
                self.text.append(block["text"])
                return block["text"]
        elif kind == "content_block_delta":
            delta = payload.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                self.text.append(delta["text"])
                return delta["text"]
            if delta.get("type") == "input_json_delta":
                block = self.blocks.get(payload.get("index", 0))
                if block is not None:
                    block["json"].append(delta.get("partial_json") or "")
        elif kind == "content_block_stop":
            self._finish_block(payload.get("index", 0))
        elif kind == "message_delta":
            self.stop_reason = (payload.get("delta") or {}).get("stop_reason") or self.stop_reason
            self._add_usage(payload.get("usage"))
        return ""  # ping, thinking blocks and unknown events are ignored

    def _finish_block(self, index: int) -> None:
        block = self.blocks.pop(index, None)
        if block is None:
            return
        text = "".join(block["json"])
        start = block.get("input")
        arguments = parse_arguments(text) if text or not isinstance(start, dict) else start
        self.calls.append(ToolCall(id=block.get("id") or f"toolu_{index}",
                                   name=block.get("name") or "", arguments=arguments))

    def _add_usage(self, raw: dict[str, Any] | None) -> None:
        for key, value in (raw or {}).items():  # message_delta counts are cumulative
            if isinstance(value, int):
                self.usage[key] = value

    def response(self) -> Response:
        for index in list(self.blocks):  # a block whose stop never came
            self._finish_block(index)
        read = self.usage.get("cache_read_input_tokens", 0)
        write = self.usage.get("cache_creation_input_tokens", 0)
        usage = Usage(input_tokens=self.usage.get("input_tokens", 0) + read + write,
                      output_tokens=self.usage.get("output_tokens", 0),
                      cache_read_tokens=read, cache_write_tokens=write)
        reason = self.stop_reason or ("tool_calls" if self.calls else "stop")
        return Response(text="".join(self.text), tool_calls=self.calls, usage=usage,
                        stop_reason=_STOP_REASONS.get(reason, reason), model=self.model)
