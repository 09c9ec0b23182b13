"""Turn what an LLM provider's HTTP API said into the errors of `bot.llm.errors`.

One place decides, for both wire formats, so OpenAI-compatible servers and Anthropic agree:

* a status and an error body (`status_error`), or an error that arrived inside a stream
  (`payload_error`, status None);
* an httpx transport failure (`transport_error`);
* the wait a server asked for (`retry_after`: `retry-after-ms`, then `Retry-After` in
  seconds or as an HTTP-date).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import httpx

from .errors import (
    AuthError,
    ContextOverflow,
    LLMError,
    Loading,
    RateLimited,
    Rejected,
    RequestError,
    ServerError,
    StreamError,
    Unreachable,
)

BODY_LIMIT = 4000  # characters of an error body kept on the exception

_CONTEXT = re.compile(
    r"context_length_exceeded|maximum context length|context window|context length"
    r"|context size|prompt is too long|request_too_large|too many tokens",
    re.IGNORECASE,
)
# What a local server (llama.cpp, Ollama, vLLM, LM Studio) says when it cannot take the
# request itself, by the part of it that is at fault: the same request gets the same
# answer, whatever the status (llama.cpp sends some of these as 500), so it is no outage.
_REJECTED = (
    ("roles", re.compile(r"roles must alternate|must alternate|system message must be at "
                         r"the beginning|conversation roles", re.IGNORECASE)),
    ("image", re.compile(r"\bimages?\b|multimodal|mmproj|vision", re.IGNORECASE)),
    ("tool_call", re.compile(r"failed to parse|parse error|could not parse|unable to parse"
                             r"|invalid json|tool.?call|chat template|jinja", re.IGNORECASE)),
)
_LOADING = re.compile(r"loading model|model is loading|still loading", re.IGNORECASE)
_SERVER_KINDS = {"api_error", "server_error", "overloaded_error", "internal_error"}
_AUTH_KINDS = {"authentication_error", "permission_error", "invalid_api_key"}


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked us to wait, or None. Headers may be in any case."""
    lower = {k.lower(): v for k, v in headers.items()}
    raw_ms = lower.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = (lower.get("retry-after") or "").strip()
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def describe_body(text: str) -> tuple[str, str]:
    """`(kind, message)` from an error body in either provider's format (or plain text).

    OpenAI: `{"error": {"message", "type", "code"}}`; Anthropic: `{"type": "error",
    "error": {"type", "message"}}`; Ollama and friends: `{"error": "text"}`.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return "", text.strip()[:500]
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, str):
        return "", error
    if not isinstance(error, dict):
        return "", text.strip()[:500]
    kind = error.get("code") or error.get("type") or ""
    return str(kind), str(error.get("message") or text.strip()[:500])


def classify(
    provider: str,
    *,
    status: int | None,
    kind: str,
    message: str,
    body: str = "",
    headers: Mapping[str, str] | None = None,
    api_key_env: str = "",
) -> LLMError:
    """The error for a failed request (`status`) or an error event inside a stream
    (`status` None, where an unknown kind counts as a server failure)."""
    headers = dict(headers or {})
    where = f"HTTP {status}" if status is not None else "stream error"
    detail = f"{provider}: {where}: {message or kind or 'no details'}"
    kw = {"provider": provider, "status": status, "body": body[:BODY_LIMIT], "headers": headers}
    text = f"{kind} {message}"
    if status == 429 or "rate_limit" in kind:
        if "insufficient_quota" in kind:  # OpenAI: out of credit; waiting will not help
            return RequestError(detail, **kw)
        return RateLimited(detail, retry_after=retry_after(headers), **kw)
    if status in (401, 403) or kind in _AUTH_KINDS:
        hint = f"check the API key in the environment variable {api_key_env}" if api_key_env \
            else "check the API key"
        return AuthError(f"{detail} ({hint})", key_env=api_key_env, **kw)
    if status == 413 or _CONTEXT.search(text):
        return ContextOverflow(detail, **kw)
    if status in (400, 422, 500) or (status is None and kind):
        cause = next((c for c, words in _REJECTED if words.search(message)), None)
        if cause is not None:
            return Rejected(detail, cause=cause, **kw)
    if status == 503 and _LOADING.search(text):
        return Loading(detail, **kw)
    if (status or 0) >= 500 or "overloaded" in text.lower() or kind in _SERVER_KINDS:
        return ServerError(detail, **kw)
    if status == 408:
        return StreamError(detail, **kw)
    if status is None:
        return ServerError(detail, **kw)
    return RequestError(detail, **kw)


def status_error(provider: str, status: int, body: str, headers: Mapping[str, str],
                 api_key_env: str) -> LLMError:
    """The error for a non-2xx response (or a 2xx that was not an event stream)."""
    kind, message = describe_body(body)
    if 200 <= status < 300:
        status = status if (kind or message) else 502
        message = message or "expected an event stream"
    return classify(provider, status=status, kind=kind, message=message, body=body,
                    headers=headers, api_key_env=api_key_env)


def payload_error(provider: str, error: object, api_key_env: str = "") -> LLMError:
    """The error for an error object that arrived inside an otherwise good stream."""
    text = json.dumps({"error": error})
    kind, message = describe_body(text)
    status = error.get("status") if isinstance(error, dict) else None
    status = status if isinstance(status, int) and status >= 400 else None
    return classify(provider, status=status, kind=kind, message=message, body=text,
                    api_key_env=api_key_env)


def transport_error(provider: str, exc: Exception) -> LLMError:
    """httpx failures: timeouts, refused or dropped connections are transient (a host
    that cannot be reached at all is `Unreachable`); a URL httpx cannot use at all is a
    request problem."""
    name = type(exc).__name__
    message = f"{provider}: {name}: {exc}" if str(exc) else f"{provider}: {name}"
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError | httpx.InvalidURL):
        return RequestError(message, provider=provider)
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return Unreachable(message, provider=provider)
    return StreamError(message, provider=provider)
