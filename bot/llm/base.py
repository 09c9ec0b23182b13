"""The one seam to a language model, and the HTTP plumbing both wire formats share.

`LLMClient.stream` makes ONE attempt: it streams the answer, awaiting `on_text(delta)` for
each piece of text as it arrives, and returns the complete `Response`. Failures are raised
as `bot.llm.errors` (retrying is `bot.llm.retry`'s job).

`open_sse` posts a JSON body and yields the server-sent events of a 2xx answer; any other
answer, and any transport failure while connecting or reading, is raised as an LLMError.
Exceptions from the caller's own code (say, `on_text`) pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from typing import Any, Protocol, runtime_checkable

import httpx

from .errors import StreamError
from .http_errors import status_error, transport_error
from .types import Request, Response

OnText = Callable[[str], Awaitable[None]]

# what httpx raises for a request that failed on the way (connect, read, timeout, decode)
_HTTPX_FAILURES = (httpx.RequestError, httpx.InvalidURL)


@runtime_checkable
class LLMClient(Protocol):
    provider: str  # "openai", "anthropic", "ollama", "scripted", ...
    model: str

    async def stream(self, request: Request, on_text: OnText | None = None) -> Response:
        """One attempt: stream the answer (text deltas to `on_text`) and return it whole."""
        ...


@asynccontextmanager
async def open_sse(
    http: httpx.AsyncClient,
    url: str,
    *,
    body: dict[str, Any],
    headers: dict[str, str],
    provider: str,
    api_key_env: str,
) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
    """POST `body` to `url` and yield an iterator of `(event, data)` pairs."""
    headers = {"accept": "text/event-stream", **headers}
    async with AsyncExitStack() as stack:
        try:
            response = await stack.enter_async_context(
                http.stream("POST", url, json=body, headers=headers))
            failed = not 200 <= response.status_code < 300 or _is_json(response)
            raw = (await response.aread()).decode("utf-8", "replace") if failed else ""
        except _HTTPX_FAILURES as exc:
            raise transport_error(provider, exc) from exc
        if failed:
            raise status_error(provider, response.status_code, raw, response.headers,
                               api_key_env)
        yield await stack.enter_async_context(aclosing(_events(response, provider)))


def _is_json(response: httpx.Response) -> bool:
    return "json" in response.headers.get("content-type", "")


async def _events(response: httpx.Response, provider: str) -> AsyncIterator[tuple[str, str]]:
    """Server-sent events as `(event, data)`; `event` defaults to "message". An event is
    complete at its blank line: a half-written one at a cut is dropped, as the spec says."""
    event, data = "", []
    lines = response.aiter_lines()
    while True:
        try:
            line = await anext(lines)
        except StopAsyncIteration:
            return
        except _HTTPX_FAILURES as exc:
            raise transport_error(provider, exc) from exc
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)


def parse_json_event(provider: str, data: str) -> dict[str, Any]:
    """One event's JSON object; a garbled event is a broken stream."""
    try:
        value = json.loads(data)
    except ValueError:
        raise StreamError(f"{provider}: malformed event in the stream: {data[:200]!r}",
                          provider=provider) from None
    if not isinstance(value, dict):
        raise StreamError(f"{provider}: unexpected event in the stream: {data[:200]!r}",
                          provider=provider)
    return value


def parse_arguments(text: str) -> dict[str, Any]:
    """Tool-call arguments: a JSON object, or `{"_raw": text}` for anything else.
    Empty text is an empty object (a tool without parameters)."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_raw": text}


def dump_arguments(arguments: dict[str, Any]) -> str:
    """Arguments back to wire text, always a JSON object. `{"_raw": text}` (what a model
    wrote that was no JSON object, stored so by older versions) goes back as `{}`: a server
    parses the arguments of every call in the history, and llama.cpp answers text it
    cannot parse with a 500 on every later request of the conversation. The call's error
    result says what was wrong with it."""
    if set(arguments) == {"_raw"}:
        return "{}"
    return json.dumps(arguments, ensure_ascii=False)
