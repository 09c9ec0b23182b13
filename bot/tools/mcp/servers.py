"""MCP servers kept up: one supervisor task per configured server holds its connection
(the SDK's transports are context managers that must be entered and left by one task).

A server is connected on first use (or at `start()`, for `steward run`); when it dies or
cannot be reached, its supervisor logs one line and connects again after a backoff (1 s,
doubling to `MAX_BACKOFF`); calls meanwhile get `Unreachable`. Nothing here ever takes
Steward down. An idle connection is pinged every `PING_SECONDS`, so a server that died
between calls is restarted before the next one needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.tools.mcp.config import McpConfig, McpServerConfig

log = logging.getLogger(__name__)

MAX_BACKOFF = 60.0
PING_SECONDS = 15.0


class Unreachable(Exception):
    """The server is not connected (starting, restarting, or failing to)."""


class CallLost(Exception):
    """The connection went away during a call: it may or may not have taken effect."""


@dataclass(frozen=True)
class RemoteTool:
    name: str
    description: str
    schema: dict[str, Any]


class McpServer:
    def __init__(self, config: McpServerConfig, secret: Callable[[str], str]):
        self.config = config
        self.name = config.name
        self._secret = secret
        self._session: Any = None
        self.tools: dict[str, RemoteTool] = {}
        self._up = asyncio.Event()
        self._lost = asyncio.Event()
        self._supervisor: asyncio.Task | None = None
        self._closing = False
        self.connects = 0  # how many times a connection was made (restarts show here)
        self.last_error = ""

    def start(self) -> None:
        if self._supervisor is None or self._supervisor.done():
            self._closing = False
            self._supervisor = asyncio.create_task(self._supervise(),
                                                   name=f"mcp:{self.name}")

    async def session(self) -> Any:
        """The live session, connecting first if needed (waits up to the connect timeout)."""
        self.start()
        if not self._up.is_set():
            try:
                await asyncio.wait_for(self._up.wait(), self.config.connect_timeout_seconds)
            except TimeoutError:
                why = f": {self.last_error}" if self.last_error else ""
                raise Unreachable(f"MCP server {self.name!r} is not reachable{why}") from None
        return self._session

    async def list_tools(self) -> dict[str, RemoteTool]:
        await self.session()
        return self.tools

    async def call(self, tool: str, arguments: dict[str, Any], *,
                   meta: dict[str, Any] | None = None) -> Any:
        """Call a tool; its `CallToolResult`. `CallLost` if the connection broke meanwhile
        (the supervisor reconnects), `Unreachable` if there was none to call on."""
        from mcp import MCPError

        session = await self.session()
        try:
            return await asyncio.wait_for(
                session.call_tool(tool, arguments, meta=meta),
                self.config.call_timeout_seconds)
        except TimeoutError:
            self._drop(session)  # a server that stopped answering is restarted
            raise CallLost(f"MCP server {self.name!r} did not answer within "
                           f"{self.config.call_timeout_seconds:g} s") from None
        except MCPError as exc:
            if _is_tool_error(exc):
                raise
            self._drop(session)
            raise CallLost(f"MCP server {self.name!r}: {exc}") from exc
        except (OSError, EOFError, ExceptionGroup) as exc:
            self._drop(session)
            raise CallLost(f"MCP server {self.name!r}: {type(exc).__name__}: {exc}") from exc

    def _drop(self, session: Any) -> None:
        """The connection `session` belongs to is gone: no call takes it any more, and the
        supervisor connects again (unless it already has: a newer session stays)."""
        if session is self._session:
            self._up.clear()
            self._lost.set()

    async def close(self) -> None:
        self._closing = True
        self._lost.set()
        if self._supervisor is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._supervisor), 5)
            except TimeoutError:
                self._supervisor.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._supervisor
            self._supervisor = None

    # -- the supervisor ------------------------------------------------------------

    async def _supervise(self) -> None:
        backoff = 1.0
        while not self._closing:
            try:
                async with self._connect() as session:
                    self._session = session
                    self.connects += 1
                    self.last_error = ""
                    backoff = 1.0
                    self._lost.clear()
                    self._up.set()
                    log.info("mcp: %s connected (%d tools)", self.name, len(self.tools))
                    await self._watch(session)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - a server never takes Steward down
                self.last_error = _describe(exc)
            finally:
                self._up.clear()
                self._session = None
            if self._closing:
                return
            log.warning("mcp: %s is down (%s); connecting again in %.0f s", self.name,
                        self.last_error or "connection closed", backoff)
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)

    async def _watch(self, session: Any) -> None:
        """Until the connection is lost (a call saw it, a ping failed) or closing."""
        while not self._lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), PING_SECONDS)
                break
            try:
                await asyncio.wait_for(session.send_ping(), self.config.connect_timeout_seconds)
            except Exception as exc:  # noqa: BLE001
                self.last_error = f"ping failed: {_describe(exc)}"
                return

    @contextlib.asynccontextmanager
    async def _connect(self):
        from mcp import ClientSession

        async with contextlib.AsyncExitStack() as stack:
            if self.config.command:
                streams = await stack.enter_async_context(self._stdio())
            else:
                streams = await stack.enter_async_context(self._http(stack))
            session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
            await asyncio.wait_for(session.initialize(), self.config.connect_timeout_seconds)
            listed = await asyncio.wait_for(session.list_tools(),
                                            self.config.connect_timeout_seconds)
            self.tools = {t.name: RemoteTool(t.name, t.description or "",
                                             dict(t.input_schema or {}))
                          for t in listed.tools}
            yield session

    def _stdio(self):
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        env = dict(self.config.env)
        for name in self.config.pass_env:
            env[name] = self._secret(name)
        params = StdioServerParameters(command=self.config.command, args=self.config.args,
                                       env=env)
        return stdio_client(params)  # its stderr is Steward's: one log for both

    @contextlib.asynccontextmanager
    async def _http(self, stack: contextlib.AsyncExitStack):
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {**self.config.headers,
                   **{h: self._secret(env) for h, env in self.config.headers_env.items()}}
        client = await stack.enter_async_context(httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(self.config.connect_timeout_seconds,
                                                    read=self.config.call_timeout_seconds)))
        async with streamable_http_client(self.config.url, http_client=client) as streams:
            yield streams


def _is_tool_error(exc: Exception) -> bool:
    """An error the server answered with (bad arguments, unknown tool): the connection is
    fine. Connection loss comes as an MCPError too, with a code of its own."""
    error = getattr(exc, "error", None)
    code = getattr(error, "code", None)
    return isinstance(code, int) and code != -32000 and "closed" not in str(exc).lower()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _describe(exc.exceptions[0])
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class McpServers:
    """Every configured server, by name."""

    def __init__(self, config: McpConfig, secret: Callable[[str], str]):
        self.config = config
        self.servers = {s.name: McpServer(s, secret) for s in config.servers}

    def __bool__(self) -> bool:
        return bool(self.servers)

    def get(self, name: str) -> McpServer | None:
        return self.servers.get(name)

    def start(self) -> None:
        """Connect every server now (`steward run`); others connect on first use."""
        for server in self.servers.values():
            server.start()

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in self.servers.values()))
