"""An HTTP client that connects only where a `NetGuard` allows, to the very address checked.

httpx does its I/O through a transport, and httpcore's connection pool opens every TCP
connection through one network-backend method, `connect_tcp(host, port)`. The backend here
asks the guard for the host's addresses (resolving the name once, checking each address)
and connects to one of those addresses itself, so there is no second lookup that a DNS
rebinding could answer differently. Everything else still sees the name: the URL, the Host
header, the TLS server name (SNI) and the certificate check, and the pool keys connections
by it. Every connection goes through the check, so every redirect hop does too.

    async with guarded_client(NetGuard(allow=["192.168.1.10"])) as http:
        response = await http.get(url)

Proxies from the environment are not used: through a proxy, the address checked would not
be the one reached.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

import httpcore
import httpx

from bot.tools.netguard import NetGuard

__all__ = ["GuardedBackend", "GuardedTransport", "guarded_client"]

TIMEOUT = httpx.Timeout(15.0, connect=10.0)

_ERRORS: dict[type[Exception], type[httpx.TransportError]] = {
    httpcore.TimeoutException: httpx.TimeoutException,
    httpcore.ConnectTimeout: httpx.ConnectTimeout,
    httpcore.ReadTimeout: httpx.ReadTimeout,
    httpcore.WriteTimeout: httpx.WriteTimeout,
    httpcore.PoolTimeout: httpx.PoolTimeout,
    httpcore.NetworkError: httpx.NetworkError,
    httpcore.ConnectError: httpx.ConnectError,
    httpcore.ReadError: httpx.ReadError,
    httpcore.WriteError: httpx.WriteError,
    httpcore.ProxyError: httpx.ProxyError,
    httpcore.UnsupportedProtocol: httpx.UnsupportedProtocol,
    httpcore.ProtocolError: httpx.ProtocolError,
    httpcore.LocalProtocolError: httpx.LocalProtocolError,
    httpcore.RemoteProtocolError: httpx.RemoteProtocolError,
}


def _as_httpx(exc: Exception) -> Exception:
    """httpcore's exception as httpx's of the same name (the most specific one)."""
    for cls in type(exc).__mro__:
        if cls in _ERRORS:
            return _ERRORS[cls](str(exc))
    return exc


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Opens a TCP connection only to an address the guard returned for the host."""

    def __init__(self, guard: NetGuard, backend: httpcore.AsyncNetworkBackend | None = None):
        self.guard = guard
        self._backend = backend or httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int,
                          timeout: float | None = None,  # noqa: ASYNC109 - httpcore's API
                          local_address: str | None = None,
                          socket_options: Iterable | None = None,
                          ) -> httpcore.AsyncNetworkStream:
        try:
            addresses = await self.guard.addresses(host, port)  # raises Refused
        except OSError as exc:  # the name does not resolve
            raise httpcore.ConnectError(f"cannot resolve {host}: "
                                        f"{exc.strerror or exc}") from exc
        error: Exception | None = None
        for address in addresses:
            try:
                return await self._backend.connect_tcp(
                    address, port, timeout=timeout, local_address=local_address,
                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc  # the next address, as a resolver's caller would
        assert error is not None
        raise error

    async def connect_unix_socket(self, path: str,
                                  timeout: float | None = None,  # noqa: ASYNC109
                                  socket_options: Iterable | None = None):
        raise httpcore.ConnectError("unix sockets are not reachable through the guard")

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _Body(httpx.AsyncByteStream):
    def __init__(self, stream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except Exception as exc:
            raise _as_httpx(exc) from exc

    async def aclose(self) -> None:
        await self._stream.aclose()


class GuardedTransport(httpx.AsyncBaseTransport):
    """httpx's transport over an httpcore pool whose connections the guard vets."""

    def __init__(self, guard: NetGuard, *, ssl_context: ssl.SSLContext | None = None):
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=10, keepalive_expiry=5.0,
            network_backend=GuardedBackend(guard))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host,
                             port=request.url.port, target=request.url.raw_path),
            headers=request.headers.raw, content=request.stream,
            extensions=request.extensions)
        try:
            response = await self._pool.handle_async_request(core)
        except Exception as exc:
            raise _as_httpx(exc) from exc
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=_Body(response.stream), extensions=response.extensions)

    async def aclose(self) -> None:
        await self._pool.aclose()


_default_context: ssl.SSLContext | None = None


async def default_ssl_context() -> ssl.SSLContext:
    """httpx's default (certifi) verification, made once and in a thread: loading the CA
    bundle reads a file."""
    global _default_context
    if _default_context is None:
        _default_context = await asyncio.to_thread(httpx.create_ssl_context)
    return _default_context


@asynccontextmanager
async def guarded_client(guard: NetGuard, *, ssl_context: ssl.SSLContext | None = None,
                         ) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose every connection the guard vets, closed on leaving; `ssl_context`
    defaults to httpx's verification. It never follows redirects by itself."""
    context = ssl_context or await default_ssl_context()
    async with httpx.AsyncClient(transport=GuardedTransport(guard, ssl_context=context),
                                 trust_env=False, timeout=TIMEOUT,
                                 follow_redirects=False) as client:
        yield client
