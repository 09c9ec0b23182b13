"""Retries around one `LLMClient.stream` call.

Transient errors (rate limits, server errors, broken or timed-out streams) are retried
with exponential backoff and full jitter: before retry n (n = 1, 2, ...) wait a random
time in [0, min(max_delay, base_delay * 2**(n-1))].

A provider that cannot be reached at all (`Unreachable`: no DNS answer, connection
refused) is tried `unreachable_attempts` times in all (default 2), the wait between them
capped at `base_delay`: a network that is down stays down for longer than backoff within
one call could wait, and the person asking should hear so in seconds, not after a minute
of silence. Whoever calls decides what to do next (the turn tells the person).

A server that is restarting is waited for, up to `wait_for_server` seconds from its first
failure: one still loading its model (`Loading`: llama.cpp's and Ollama's 503 "Loading
model"), and one that refuses connections after it has answered in this process (the
client's `reached`, or `seen`): a local model takes 10-60 s to load after a restart. The waits grow
from `base_delay` to `SERVER_POLL_CAP` seconds, so the answer comes soon after the server
is back; they do not count against `max_attempts`. The call stays a running task all the
while: a process killed meanwhile sends it again when it starts.

A rate limit with a `retry_after` is honoured exactly, without jitter, even beyond
`max_delay`, up to `RETRY_AFTER_CAP` times `max_delay`. A server that asks for more than
that is not retried here: the RateLimited error is raised at once (the turn tells the user
how long the provider asks to wait), since waiting less than asked would only earn another
429 and burn attempts.

Hooks: `on_attempt(response, None)` / `on_attempt(None, error)` after every attempt,
failed ones included (the usage ledger); `on_retry(attempt, error, delay)` before each
retry (discard the partial stream of the attempt that failed).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable

from .base import LLMClient, OnText
from .errors import LLMError, Loading, RateLimited, TransientError, Unreachable
from .types import Request, Response

RETRY_AFTER_CAP = 5  # honour Retry-After up to this many times max_delay
UNREACHABLE_ATTEMPTS = 2  # tries in all when no connection can be made
SERVER_POLL_CAP = 5.0  # seconds between tries at most while a server restarts

OnAttempt = Callable[[Response | None, Exception | None], Awaitable[None]]
OnRetry = Callable[[int, LLMError, float], Awaitable[None]]


def backoff_delay(error: LLMError, retry: int, *, base_delay: float, max_delay: float,
                  rand: Callable[[], float] = random.random) -> float | None:
    """Seconds to wait before retry number `retry` (1-based), or None: do not retry."""
    if isinstance(error, RateLimited) and error.retry_after is not None:
        return error.retry_after if error.retry_after <= RETRY_AFTER_CAP * max_delay else None
    if isinstance(error, Unreachable):
        return rand() * min(max_delay, base_delay)
    return rand() * min(max_delay, base_delay * 2 ** (retry - 1))


async def stream_with_retries(
    client: LLMClient,
    request: Request,
    on_text: OnText | None = None,
    *,
    on_attempt: OnAttempt | None = None,
    on_retry: OnRetry | None = None,
    max_attempts: int = 5,
    base_delay: float = 1.0,
    max_delay: float = 60.0,
    unreachable_attempts: int = UNREACHABLE_ATTEMPTS,
    wait_for_server: float = 0.0,
    seen: bool = False,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    rand: Callable[[], float] = random.random,
    clock: Callable[[], float] = time.monotonic,
) -> Response:
    """`client.stream(request, on_text)`, retrying transient errors (see the module doc).
    Non-transient errors, and the last transient one, are raised."""
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    attempt = 1  # tries that count against max_attempts
    tried = 0  # tries in all
    restarting_since: float | None = None
    waits = 0
    while True:
        tried += 1
        try:
            response = await client.stream(request, on_text)
        except Exception as error:
            if on_attempt is not None:
                await on_attempt(None, error)
            if wait_for_server > 0 and restarting(client, error, seen=seen):
                restarting_since = clock() if restarting_since is None else restarting_since
                left = wait_for_server - (clock() - restarting_since)
                if left <= 0:
                    raise
                waits += 1
                step = min(SERVER_POLL_CAP, base_delay * 2 ** (waits - 1))
                delay = min(left, step * (0.5 + rand() / 2))
                if on_retry is not None:
                    await on_retry(tried, error, delay)
                await sleep(delay)
                continue
            if not isinstance(error, TransientError) or attempt >= max_attempts:
                raise
            if isinstance(error, Unreachable) and attempt >= unreachable_attempts:
                raise
            delay = backoff_delay(error, attempt, base_delay=base_delay, max_delay=max_delay,
                                  rand=rand)
            if delay is None:
                raise
            if on_retry is not None:
                await on_retry(tried, error, delay)
            await sleep(delay)
            attempt += 1
            continue
        if on_attempt is not None:
            await on_attempt(response, None)
        return response


def restarting(client: LLMClient, error: Exception, *, seen: bool = False) -> bool:
    """Whether `error` says the server is restarting (see the module doc); `seen`: it
    answered before, in an earlier process (the call was waiting for it when that ended)."""
    return isinstance(error, Loading) or (
        isinstance(error, Unreachable) and (seen or bool(getattr(client, "reached", False))))
