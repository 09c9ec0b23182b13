"""A model that plays a script: for tests and for the offline demo (no network at all).

`ScriptedModel(script)` where `script` is either a list, played in order (a `Response` is
answered, an `LLMError` is raised; running out raises RequestError("script exhausted")),
or a function `(Request) -> Response`, sync or async. The text is streamed to `on_text` in
`chunk_chars` pieces (with `delay` seconds between them), and usage is estimated at about
four characters a token when the scripted Response reports none. Every request is kept
in `.requests`.

`demo_model()` is the offline demo: when its tools are offered and asked for, it keeps a
fact ("remember that ..."), says what it remembers ("what do you know about me?", from
the facts in its context), searches history ("search for ...", "when did ...?"), sets a
reminder and says it when it fires ("remind me in 2 minutes to ..."), adds to the to-do
list and tells the time; it summarises tool results, and otherwise says what it is.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime

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
    images = sum(i.tokens for m in request.messages for i in m.images)
    return Usage(input_tokens=estimate_tokens(prompt) + images,
                 output_tokens=estimate_tokens(answer))


# ---------------------------------------------------------------- the offline demo

_TIME = re.compile(r"\b(time|date|day|today|clock|hour)\b", re.IGNORECASE)
_TODO_PREFIX = re.compile(r"^\s*(?:to-?do)\s*:\s*(?P<item>.+?)\s*$", re.IGNORECASE | re.DOTALL)
_TODO_ADD = re.compile(r"\badd\s+(?P<item>.+?)\s+to\s+my\s+to-?do(?:\s+list)?\b",
                       re.IGNORECASE | re.DOTALL)


_REMEMBER = re.compile(r"^\s*remember\s+(?:that\s+)?(?P<fact>.+?)\s*[.!]?\s*$",
                       re.IGNORECASE | re.DOTALL)
_KNOWN = re.compile(r"\bwhat do you (?:know|remember)\b", re.IGNORECASE)
_SEARCH = re.compile(r"^\s*(?:search(?:\s+for)?|find|look up)\s+(?P<query>.+?)\s*[.?!]?\s*$|"
                     r"^\s*(?P<question>(?:when|who|what|where)\s+did\s+.+?)\s*\??\s*$",
                     re.IGNORECASE | re.DOTALL)
_REMIND = re.compile(r"\bremind me in\s+(?P<n>\d{1,4})\s*(?P<unit>s|sec|secs|seconds?|m|min|"
                     r"mins|minutes?|h|hours?)\s+(?:to\s+)?(?P<what>.+?)\s*[.!]?\s*$",
                     re.IGNORECASE | re.DOTALL)
_REMINDER = re.compile(r"^Remind the user to (?P<what>.+?)\.?\s*\Z", re.MULTILINE | re.DOTALL)
_FACTS = "What you know about the people here (long-term memory):\n"
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600}


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
    if (reminder := _REMINDER.search(said)) is not None:  # a reminder the demo set, firing
        return Response(text=f"Reminder: {reminder['what']}.")
    if (remind := _REMIND.search(said)) and "schedule" in tools:
        seconds = int(remind["n"]) * _UNIT_SECONDS[remind["unit"][0].lower()]
        at = datetime.fromtimestamp(time.time() + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        what = remind["what"].rstrip(".!")
        return Response(tool_calls=[ToolCall(id=call_id, name="schedule", arguments={
            "action": "create", "name": what[:60], "prompt": f"Remind the user to {what}.",
            "at": at, "timezone": "UTC"})])
    if (remember := _REMEMBER.match(said)) and "remember_fact" in tools:
        return Response(tool_calls=[ToolCall(id=call_id, name="remember_fact",
                                             arguments={"fact": remember["fact"]})])
    if _KNOWN.search(said):
        system = next((m.content for m in request.messages if m.role == "system"), "")
        known = system.split(_FACTS, 1)[1].strip() if _FACTS in system else ""
        return Response(text=f"Here is what I remember:\n{known}" if known else
                        "I do not remember anything about you yet; tell me \"remember that "
                        "...\".")
    if (search := _SEARCH.match(said)) and "search_history" in tools:
        query = (search["query"] or search["question"]).strip()
        return Response(tool_calls=[ToolCall(id=call_id, name="search_history",
                                             arguments={"query": query[:500]})])
    todo = _TODO_PREFIX.match(said) or _TODO_ADD.search(said)
    if todo and "todo" in tools:
        item = todo["item"].strip().rstrip(".!")
        return Response(tool_calls=[ToolCall(id=call_id, name="todo",
                                             arguments={"action": "add", "item": item})])
    if _TIME.search(said) and "current_time" in tools:
        return Response(tool_calls=[ToolCall(id=call_id, name="current_time", arguments={})])
    echo = said if len(said) <= 200 else said[:197] + "..."
    return Response(text=f'You said: "{echo}". I am the offline demo model: try "remember '
                         'that ...", "what do you know about me?", "search for ...", "remind '
                         'me in 1 minute to ...", "add ... to my todo" or "what time is it?"; '
                         "configure [llm] in config.toml (or set OPENAI_API_KEY or "
                         "ANTHROPIC_API_KEY) for a real model.")


_HIT = re.compile(r"^\d+\. (?P<when>[^·\n]+?) · (?P<where>[^·\n]+?) · #\d+\n(?:   … .*\n)*"
                  r"   > (?P<said>.*)$", re.MULTILINE)


def _found(result: Message, question: str) -> str | None:
    """A search's hits as a person would tell them (the question itself left out)."""
    hits = [f"{m['when']} in {m['where']}: {m['said']}" for m in _HIT.finditer(result.content)
            if question not in m["said"]]
    if result.name != "search_history" or result.is_error:
        return None
    if not hits:
        return "I found nothing about that."
    return "I found:\n" + "\n".join(f"- {h if len(h) <= 300 else h[:297] + '...'}"
                                     for h in hits[:3])


def _summarise_results(messages: list[Message]) -> str:
    results: list[Message] = []
    for message in reversed(messages):
        if message.role != "tool":
            break
        results.insert(0, message)
    question = next((m.content.strip() for m in reversed(messages) if m.role == "user"), "")
    if len(results) == 1 and (found := _found(results[0], question)) is not None:
        return found
    parts = []
    for result in results:
        text = " ".join(result.content.split()) or "(no output)"
        text = text if len(text) <= 700 else text[:697] + "..."
        label = f"{result.name}: " if result.name else ""
        parts.append(f"{label}{'failed: ' if result.is_error else ''}{text}")
    return "Done: " + "; ".join(parts)
