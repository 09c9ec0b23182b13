"""The Slack Web API, through slack_sdk's AsyncWebClient, pointed at `api_base_url`.

Two clients share one aiohttp session:

* `call(...)` for calls that are safe to repeat (updates, reads, reactions): retried on
  429 (waiting out Retry-After), on 500/503 and on dropped connections;
* `post(...)` for `chat.postMessage`: retried on 429 only, because a 500 or a dropped
  connection may hide a message that was posted; the caller looks for it by its key
  before posting again (see `messages.py`).

`close()` lets calls in flight finish, then closes the session; calls after that still
work, each on a session of its own (slack_sdk's behaviour without a shared session), so
deliveries that run while the process drains are not lost.

Whatever a call raises is marked as Slack's (`faults.from_slack`), so that a refused
connection or a timeout of a Slack call is never taken for the store's outage, nor the
store's for Slack's.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncRateLimitErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.http_retry.builtin_interval_calculators import BackoffRetryIntervalCalculator
from slack_sdk.http_retry.jitter import Jitter
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from .faults import mark_from_slack

TIMEOUT = 30  # seconds per request
RATE_LIMIT_RETRIES = 5
SERVER_ERROR_RETRIES = 3
RETRY_BACKOFF = 0.5  # seconds before the first retry of a 5xx or a connection error; doubles
RETRY_JITTER = 1.0  # up to this many seconds added at random to each of those pauses


class _Jitter(Jitter):
    def recalculate(self, duration: float) -> float:
        return duration + random.random() * RETRY_JITTER


class SlackWeb:
    def __init__(self, token: str, base_url: str):
        self.token = token
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self._session: aiohttp.ClientSession | None = None
        self._client: AsyncWebClient | None = None
        self._poster: AsyncWebClient | None = None
        self._inflight = 0
        self._settled = asyncio.Event()

    def _clients(self) -> tuple[AsyncWebClient, AsyncWebClient]:
        if self._client is None or self._poster is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
            rate = AsyncRateLimitErrorRetryHandler(max_retry_count=RATE_LIMIT_RETRIES)
            backoff = BackoffRetryIntervalCalculator(backoff_factor=RETRY_BACKOFF, jitter=_Jitter())
            self._client = AsyncWebClient(
                token=self.token, base_url=self.base_url, session=self._session,
                timeout=TIMEOUT, retry_handlers=[
                    rate, AsyncServerErrorRetryHandler(max_retry_count=SERVER_ERROR_RETRIES,
                                                       interval_calculator=backoff),
                    AsyncConnectionErrorRetryHandler(max_retry_count=SERVER_ERROR_RETRIES,
                                                     interval_calculator=backoff)])
            self._poster = AsyncWebClient(token=self.token, base_url=self.base_url,
                                          session=self._session, timeout=TIMEOUT,
                                          retry_handlers=[rate])
        return self._client, self._poster

    @property
    def client(self) -> AsyncWebClient:
        """The retrying client itself (for slack_sdk parts that want one)."""
        return self._clients()[0]

    def bare_client(self) -> AsyncWebClient:
        """A client with no token (bolt's own, which gets tokens from `authorize`)."""
        return AsyncWebClient(base_url=self.base_url, timeout=TIMEOUT)

    async def call(self, method: str, **kwargs: Any) -> AsyncSlackResponse:
        """`method` is the SDK's name for it, e.g. "chat_update"."""
        return await self._run(self._clients()[0], method, kwargs)

    async def post(self, **kwargs: Any) -> AsyncSlackResponse:
        return await self._run(self._clients()[1], "chat_postMessage", kwargs)

    async def _run(self, client: AsyncWebClient, method: str, kwargs: dict):
        self._inflight += 1
        try:
            return await getattr(client, method)(**kwargs)
        except Exception as exc:
            mark_from_slack(exc, method)
            raise
        finally:
            self._inflight -= 1
            if not self._inflight:
                self._settled.set()

    async def close(self, grace: float = 5.0) -> None:
        session = self._session
        if session is None:
            return
        for client in (self._client, self._poster):
            if client is not None:
                client.session = None  # from now on: a session per call
        self._session = None
        if self._inflight:
            self._settled.clear()
            try:
                await asyncio.wait_for(self._settled.wait(), grace)
            except TimeoutError:
                pass
        await session.close()
