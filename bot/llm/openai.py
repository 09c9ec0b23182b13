"""OpenAI-compatible chat completions, streamed: OpenAI, Ollama, llama.cpp, vLLM, OpenRouter.

Wire notes: text arrives as `choices[0].delta.content`; tool calls as
`delta.tool_calls[i]` keyed by `index` (id and name first, `function.arguments` in
pieces); `finish_reason` in the last choice chunk; with `stream_options.include_usage`
a final chunk with empty `choices` carries `usage`; then `data: [DONE]`. A stream that
ends with neither `[DONE]` nor a `finish_reason` was cut: StreamError.

Usage: `input_tokens` is `prompt_tokens` (the whole prompt, cached part included) and
`cache_read_tokens` is `prompt_tokens_details.cached_tokens`.

Images: a user message with images is sent as content parts, its text first, then one
`image_url` part per image with a `data:` URL of the stored file.

Repairs: a server that rejects the request for something in it (roles out of the order its
template demands, a tool call it cannot parse, an image it cannot read: `Rejected`) gets it
again in a shape it takes (`bot.llm.repair`), within the same attempt; what the person
should know about that rides on `Response.notes`.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx

from .base import OnText, dump_arguments, open_sse, parse_arguments, parse_json_event
from .errors import LLMError, Rejected, StreamError
from .http_errors import payload_error
from .repair import Shape, repaired, shaped
from .types import Message, Request, Response, ToolCall, Usage, image_data, missing_image

log = logging.getLogger(__name__)

_STOP_REASONS = {"stop": "stop", "tool_calls": "tool_calls", "function_call": "tool_calls",
                 "length": "length"}


class OpenAIClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        *,
        base_url: str,
        api_key: str | None,
        api_key_env: str = "OPENAI_API_KEY",
        model: str,
        provider: str = "openai",
    ) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.api_key_env = api_key_env
        self.model = model
        self.provider = provider
        # The request shape each model's server takes, as learned (`bot.llm.repair`).
        self.shapes: dict[str, Shape] = {}
        # The server has answered in this process: a refused connection later is a restart
        # worth waiting for (`bot.llm.retry`), not a server that was never there.
        self.reached = False

    def __repr__(self) -> str:
        return f"OpenAIClient(provider={self.provider!r}, model={self.model!r}, " \
               f"base_url={self.base_url!r})"

    async def stream(self, request: Request, on_text: OnText | None = None) -> Response:
        """One attempt, in the shape the server takes: a request it rejects for something
        in it (`Rejected`, before any text came) is sent again repaired (`bot.llm.repair`),
        and the shape that worked is kept for the model's later requests."""
        model = request.model or self.model
        shape = self.shapes.get(model, Shape())
        streamed = False

        async def seen(text: str) -> None:
            nonlocal streamed
            streamed = True
            if on_text is not None:
                await on_text(text)

        while True:
            sent, notes = shaped(request, shape)
            try:
                response = await self._stream(sent, seen)
            except LLMError as exc:
                self.reached = self.reached or exc.status is not None  # it answered
                if not isinstance(exc, Rejected):
                    raise
                better = None if streamed else repaired(shape, exc, request)
                if better is None:
                    raise
                log.info("%s %s: the server refused the request for its %s (HTTP %s); "
                            "sending it again as %s", self.provider, model, exc.cause,
                            exc.status, better)
                shape = better
                self.shapes[model] = better.remembered()
                continue
            self.reached = True
            if notes:
                response.notes = [*response.notes, *notes]
            return response

    async def _stream(self, request: Request, on_text: OnText) -> Response:
        model = request.model or self.model
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        assembly = _Assembly(model)
        body = self.wire_body(request, await image_data(request))
        async with open_sse(self.http, f"{self.base_url}/chat/completions",
                            body=body, headers=headers,
                            provider=self.provider, api_key_env=self.api_key_env) as events:
            async for _event, data in events:
                if data.strip() == "[DONE]":
                    assembly.done = True
                    break
                chunk = parse_json_event(self.provider, data)
                if chunk.get("error"):
                    raise payload_error(self.provider, chunk["error"], self.api_key_env)
                text = assembly.add(chunk)
                if text:
                    await on_text(text)
        if not assembly.done and assembly.finish_reason is None:
            raise StreamError(f"{self.provider}: the stream ended before [DONE]",
                              provider=self.provider)
        return assembly.response()

    def wire_body(self, request: Request,
                  images: dict[str, str | None] | None = None) -> dict[str, Any]:
        """The JSON body for `request` (public so the exact request can be inspected);
        `images`: the base64 of its images by sha256 (`image_data`), else they are
        named by their stored path."""
        # OpenAI's own API wants max_completion_tokens (reasoning models reject max_tokens);
        # compatible servers know max_tokens
        limit = "max_completion_tokens" if "api.openai.com" in self.base_url else "max_tokens"
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": [wire_message(m, images) for m in request.messages],
            "stream": True,
            "stream_options": {"include_usage": True},
            limit: request.max_tokens,
        }
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {
                    "name": t.name, "description": t.description, "parameters": t.parameters}}
                for t in request.tools
            ]
        if request.temperature is not None:
            body["temperature"] = request.temperature
        return body


def wire_message(message: Message,
                 images: dict[str, str | None] | None = None) -> dict[str, Any]:
    """A neutral message in chat-completions form."""
    if message.role == "tool":
        content = message.content
        if message.is_error and not content.lower().startswith("error"):
            content = f"Error: {content}"
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": content}
    if message.role == "assistant" and message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": dump_arguments(c.arguments)}}
                for c in message.tool_calls
            ],
        }
    if message.role == "user" and message.images:
        return {"role": "user", "content": _parts(message, images)}
    return {"role": message.role, "content": message.content}


def _parts(message: Message, images: dict[str, str | None] | None) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.content}] \
        if message.content else []
    for image in message.images:
        if images is None:
            url = f"file://{image.path}"  # inspection only: never sent like this
        elif images.get(image.sha256) is None:
            parts.append({"type": "text", "text": missing_image(image)})
            continue
        else:
            url = f"data:{image.media_type};base64,{images[image.sha256]}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


class _Assembly:
    """The answer, put together chunk by chunk."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}  # index -> {"id", "name", "args": [...]}
        self.finish_reason: str | None = None
        self.usage = Usage()
        self.done = False

    def add(self, chunk: dict[str, Any]) -> str:
        """Take one chunk in; return its text delta ("" if none)."""
        self.model = chunk.get("model") or self.model
        if chunk.get("usage"):
            self.usage = _usage(chunk["usage"])
        text = ""
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            if text:
                self.text.append(text)
            for piece in delta.get("tool_calls") or []:
                self._add_call(piece)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return text

    def _add_call(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        if not isinstance(index, int):  # servers that omit it send whole calls in order
            if piece.get("id"):
                known = {c["id"]: i for i, c in self.calls.items()}
                index = known.get(piece["id"], len(self.calls))
            else:
                index = max(self.calls, default=0)
        call = self.calls.setdefault(index, {"id": "", "name": "", "args": []})
        function = piece.get("function") or {}
        call["id"] = piece.get("id") or call["id"]
        call["name"] = function.get("name") or call["name"]
        if function.get("arguments"):
            arguments = function["arguments"]
            # some servers send a parsed object instead of text
            call["args"].append(arguments if isinstance(arguments, str)
                                else dump_arguments(arguments))

    def response(self) -> Response:
        calls = [
            ToolCall(id=c["id"] or f"call_{i}", name=c["name"],
                     arguments=parse_arguments("".join(c["args"])))
            for i, c in sorted(self.calls.items())
        ]
        reason = _STOP_REASONS.get(self.finish_reason or "stop", self.finish_reason or "stop")
        if calls and reason == "stop":  # some servers say "stop" after tool calls
            reason = "tool_calls"
        return Response(text="".join(self.text), tool_calls=calls, usage=self.usage,
                        stop_reason=reason, model=self.model)


def _usage(raw: dict[str, Any]) -> Usage:
    details = raw.get("prompt_tokens_details") or {}
    return Usage(
        input_tokens=raw.get("prompt_tokens") or 0,
        output_tokens=raw.get("completion_tokens") or 0,
        cache_read_tokens=details.get("cached_tokens") or 0,
        cost_usd=raw["cost"] if isinstance(raw.get("cost"), int | float) else None,
    )
