"""A model that plays a script: for tests and for the offline demo (no network at all).

`ScriptedModel(script)` where `script` is either a list, played in order (a `Response` is
answered, an `LLMError` is raised; running out raises RequestError("script exhausted")),
or a function `(Request) -> Response`, sync or async. The text is streamed to `on_text` in
`chunk_chars` pieces (with `delay` seconds between them), and usage is estimated at about
four characters a token when the scripted Response reports none. Every request is kept
in `.requests`.

`demo_model()` is the offline demo: it calls the `current_time` and `todo` tools when
they are offered and asked for, summarises tool results, and otherwise says what it is.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable

from .base import OnText
from .errors import LLMError, RequestError
from .types import Message, Request, Response, ToolCall, Usage

ScriptFunction = Callable[[Request], Response | Awaitable[Response]]


class ScriptedModel:
    __test__ = False  # not a pytest test class, despite living next to tests' needs

    def __init__(
        self,
        script: Iterable[Response | LLMError] | ScriptFunction,
        *,
        model: str = "scripted",
        provider: str = "scripted",
        chunk_chars: int = 8,
        delay: float = 0.0,
    ) -> None:
        if chunk_chars < 1:
            raise ValueError("chunk_chars must be at least 1")
        self._function = script if callable(script) else None
        self._script = [] if callable(script) else list(script)
        self.model = model
        self.provider = provider
        self.chunk_chars = chunk_chars
        self.delay = delay
        self.requests: list[Request] = []

    def __repr__(self) -> str:
        return f"ScriptedModel(model={self.model!r})"

    @property
    def remaining(self) -> int:
        """Entries of a list script not played yet (0 for a function script)."""
        return len(self._script)

    async def stream(self, request: Request, on_text: OnText | None = None) -> Response:
        self.requests.append(request)
        response = await self._next(request)
        text = response.text
        for start in range(0, len(text), self.chunk_chars):
            if start and self.delay:
                await asyncio.sleep(self.delay)
            if on_text is not None:
                await on_text(text[start:start + self.chunk_chars])
        update: dict = {}
        if response.usage == Usage():
            update["usage"] = estimate_usage(request, response)
        if not response.model:
            update["model"] = request.model or self.model
        if response.tool_calls and response.stop_reason == "stop":
            update["stop_reason"] = "tool_calls"
        return response.model_copy(update=update, deep=True)

    async def _next(self, request: Request) -> Response:
        if self._function is not None:
            result = self._function(request)
            if inspect.isawaitable(result):
                result = await result
            return result
        if not self._script:
            raise RequestError("script exhausted", provider=self.provider)
        item = self._script.pop(0)
        if isinstance(item, LLMError):
            raise item
        return item


def estimate_tokens(text: str) -> int:
    """About four characters a token (never zero for non-empty text)."""
    return math.ceil(len(text) / 4)


def estimate_usage(request: Request, response: Response) -> Usage:
    prompt = "".join(m.content + "".join(json.dumps(c.arguments) for c in m.tool_calls)
                     for m in request.messages)
    prompt += "".join(t.name + t.description + json.dumps(t.parameters) for t in request.tools)
    answer = response.text + "".join(c.name + json.dumps(c.arguments)
                                     for c in response.tool_calls)
    return Usage(input_tokens=estimate_tokens(prompt), output_tokens=estimate_tokens(answer))


# ---------------------------------------------------------------- the offline demo

_TIME = re.compile(r"\b(time|date|day|today|clock|hour)\b", re.IGNORECASE)
_TODO_PREFIX = re.compile(r"^\s*(?:to-?do)\s*:\s*(?P<item>.+?)\s*$", re.IGNORECASE | re.DOTALL)
_TODO_ADD = re.compile(r"\badd\s+(?P<item>.+?)\s+to\s+my\s+to-?do(?:\s+list)?\b",
                       re.IGNORECASE | re.DOTALL)


def demo_model(*, chunk_chars: int = 8, delay: float = 0.0) -> ScriptedModel:
    """The offline demo model: helpful enough to show the agent working without a network."""
    return ScriptedModel(demo_reply, model="offline-demo", chunk_chars=chunk_chars, delay=delay)


def demo_reply(request: Request) -> Response:
    """What the demo model answers to `request` (deterministic, including tool-call ids)."""
    messages = [m for m in request.messages if m.role != "system"]
    if messages and messages[-1].role == "tool":
        return Response(text=_summarise_results(messages))
    said = next((m.content.strip() for m in reversed(messages) if m.role == "user"), "")
    tools = {t.name for t in request.tools}
    call_id = f"demo_{len(request.messages)}"
    todo = _TODO_PREFIX.match(said) or _TODO_ADD.search(said)
    if todo and "todo" in tools:
        item = todo["item"].strip().rstrip(".!")
        return Response(tool_calls=[ToolCall(id=call_id, name="todo",
                                             arguments={"action": "add", "item": item})])
    if _TIME.search(said) and "current_time" in tools:
        return Response(tool_calls=[ToolCall(id=call_id, name="current_time", arguments={})])
    echo = said if len(said) <= 200 else said[:197] + "..."
    return Response(text=f'You said: "{echo}". I am the offline demo model, so that is all I '
                         "can do; configure [llm] in config.toml (or set OPENAI_API_KEY or "
                         "ANTHROPIC_API_KEY) for a real one.")


def _summarise_results(messages: list[Message]) -> str:
    results: list[Message] = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        results.insert(0, message)
    parts = []
    for result in results:
        text = " ".join(result.content.split()) or "(no output)"
        text = text if len(text) <= 200 else text[:197] + "..."
        label = f"{result.name}: " if result.name else ""
        parts.append(f"{label}{'failed: ' if result.is_error else ''}{text}")
    return "Done: " + "; ".join(parts)
