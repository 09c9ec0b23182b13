"""What the model sees of MCP servers: two tools, whatever the number of servers and tools.

* `mcp_call(server, tool, arguments)` — its description is the index: one line per
  server from the config, so the tool list (and the prompt cache) does not change when a
  server adds tools or restarts.
* `mcp_tools(server)` — a server's tools with their argument schemas, fetched when the
  model picks the server (progressive disclosure: 200 tools cost nothing until needed).

Each MCP tool keeps its own replay policy (`McpServerConfig.policy_of`, `unsafe` unless
the config says otherwise) through `Tool.policy_fn`: an unsafe call cut off by a crash is
reported as interrupted, never repeated; a keyed call carries its idempotency key in the
request's `_meta` (`idempotency_key`), the same on every attempt. What a call returns is
text from outside (READS_OUTSIDE): shown to the model as data, and sending afterwards asks
first. Whether a call may run unasked after outside text is trust, not replay: only the
tools the owner lists in `trusted` (bot/tools/mcp/config.py). A server that died during a
call leaves it undecided; the model is told so.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

from pydantic import Field

from bot.runtime.definitions import Policy
from bot.tools.base import Tool, ToolContext, ToolResult, tool
from bot.tools.mcp.servers import CallLost, McpServers, Unreachable
from bot.tools.permissions import NETWORK, READS_OUTSIDE, Asking

IDEMPOTENCY_META = "idempotency_key"


def mcp_tools(servers: McpServers) -> list[Tool]:
    """The two tools, for the configured servers (none: no tools)."""
    if not servers:
        return []
    index = "; ".join(f"{s.name}" + (f" ({s.description})" if s.description else "")
                      for s in servers.config.servers)

    def _server(name: str):
        server = servers.get(name)
        if server is None:
            known = ", ".join(servers.servers)
            raise LookupError(f"there is no MCP server {name!r}; the servers are: {known}")
        return server

    def policy(arguments: dict) -> Policy:
        server = servers.get(str(arguments.get("server", "")))
        if server is None:
            return Policy.SAFE  # answered with an error, nothing runs
        return Policy(server.config.policy_of(str(arguments.get("tool", ""))))

    async def ask_first(asking: Asking, server: str, tool: str, arguments: dict) -> str | None:
        """After outside text, a call waits for the person unless the owner trusts the tool
        (`trusted` in its server's config): replay policy is not trust."""
        known = servers.get(server)
        if known is None:
            return None  # answered with an error, nothing runs
        if asking.read_outside and not known.config.trusts(tool):
            return (f"run {tool} on {server} ({_shown(arguments)}), asked for after reading "
                    f"text from outside (via {asking.read_outside}), which may be trying to "
                    "make me do it")
        return None

    @tool(name="mcp_tools", policy=Policy.SAFE, touches=frozenset({NETWORK}),
          description="List the tools of one MCP server with their arguments (JSON "
                      f"schemas), before calling one with mcp_call. Servers: {index}.")
    async def list_server_tools(
            server: Annotated[str, Field(description="the server's name")]) -> Any:
        found = await _server(server).list_tools()
        return [{"name": t.name, "description": t.description,
                 "arguments": _without_titles(t.schema),
                 "replay": _server(server).config.policy_of(t.name)}
                for t in found.values()]

    @tool(name="mcp_call", touches=frozenset({READS_OUTSIDE, NETWORK}), approval=ask_first,
          description=f"Call a tool on an MCP server. Servers: {index}. See a server's tools "
                      "and their arguments with mcp_tools first.")
    async def call(ctx: ToolContext,
                   server: Annotated[str, Field(description="the server's name")],
                   tool: Annotated[str, Field(description="the tool's name on that server")],
                   arguments: Annotated[dict[str, Any], Field(
                       description="the tool's arguments, as its schema says")] = {}) -> Any:  # noqa: B006
        remote = _server(server)
        try:
            listed = await remote.list_tools()
        except Unreachable as exc:
            return ToolResult(f"error: not run: {exc}", is_error=True)
        if tool not in listed:
            return ToolResult(f"error: {server} has no tool {tool!r}; its tools: "
                              f"{', '.join(sorted(listed)) or 'none'}", is_error=True)
        keyed = remote.config.policy_of(tool) == "keyed"
        meta = {IDEMPOTENCY_META: ctx.idem_key} if keyed and ctx.idem_key else None
        try:
            result = await remote.call(tool, arguments, meta=meta)
        except Unreachable as exc:
            return ToolResult(f"error: not run: {exc}", is_error=True)
        except CallLost as exc:
            return ToolResult(f"error: interrupted: {exc}. It may or may not have taken "
                              "effect; check before calling it again.", is_error=True)
        except Exception as exc:  # noqa: BLE001 - an error the server answered with
            return ToolResult(f"error: {server} refused the call: {exc}", is_error=True)
        return render(result)

    return [list_server_tools, dataclasses.replace(call, policy_fn=policy)]


def render(result: Any) -> ToolResult:
    """A `CallToolResult` as the model reads it: its text, other content named."""
    parts = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {block.mime_type}, {len(block.data) * 3 // 4:,} bytes]")
        elif kind == "resource":
            contents = block.resource
            text = getattr(contents, "text", None)
            parts.append(text if text is not None else f"[resource: {contents.uri}]")
        elif kind == "resource_link":
            parts.append(f"[link: {block.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        return ToolResult(f"error: {text or 'the tool failed'}", is_error=True)
    return ToolResult(text)


def _without_titles(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _without_titles(v) for k, v in schema.items()
                if not (k == "title" and isinstance(v, str))}
    if isinstance(schema, list):
        return [_without_titles(v) for v in schema]
    return schema


def _shown(arguments: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(arguments.items()))[:300]
