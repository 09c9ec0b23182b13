"""MCP servers, for real: the test server (`tests/fakes/mcp_server.py`, written with the
SDK) runs as a subprocess over stdio or streamable HTTP. Calls work and render; a server
that dies mid-call leaves that call reported as interrupted (never repeated) and is
restarted with backoff; a server that cannot start never takes anything down; a keyed
tool gets the same idempotency key on every attempt; 200 tools on a server add nothing to
the model's tool list."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path

import httpx
import pytest

from bot.runtime.definitions import Policy
from bot.tools import ToolBox, ToolContext, builtin_tools
from bot.tools.mcp import McpConfig
from bot.tools.mcp.servers import McpServers, Unreachable
from bot.tools.mcp.tools import mcp_tools
from bot.tools.permissions import READS_OUTSIDE, Asking, Recipients

ROOT = Path(__file__).parent.parent
SERVER = ["-m", "tests.fakes.mcp_server"]


LEDGER: dict[str, str] = {}  # the running test's ledger (set by the `ledger` fixture)


def stdio(name: str = "test", env: dict | None = None, **extra) -> dict:
    """A stdio server entry; the SDK passes only a safe part of Steward's environment, so
    what the server needs is in its `env`."""
    return {"name": name, "command": sys.executable, "args": SERVER,
            "env": {"PYTHONPATH": str(ROOT), **LEDGER, **(env or {})}, **extra}


@pytest.fixture
def ledger(tmp_path):
    LEDGER["MCP_LEDGER"] = str(tmp_path / "ledger")
    yield tmp_path / "ledger"
    LEDGER.clear()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def hub(*servers: dict, env: dict | None = None) -> McpServers:
    env = env or {}
    return McpServers(McpConfig.model_validate({"servers": list(servers)}),
                      lambda name: env[name])


def context(store, idem_key: str = "turn1.0.0") -> ToolContext:
    return ToolContext(store=store, task_id="t1", idem_key=idem_key,
                       http=httpx.AsyncClient())


def tools_of(servers: McpServers) -> dict:
    return {t.name: t for t in mcp_tools(servers)}


async def test_a_stdio_server_is_listed_and_called(ledger):
    servers = hub(stdio(description="a test server"))
    try:
        found = await servers.get("test").list_tools()
        assert {"add", "record", "die"} <= set(found)
        result = await servers.get("test").call("add", {"a": 2, "b": 40})
        assert result.content[0].text == "42" and not result.is_error
        await servers.get("test").call("record", {"text": "hello"})
        assert lines(ledger) == ["record hello"]
    finally:
        await servers.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_the_model_sees_two_tools_and_the_index(store, ledger):
    servers = hub(stdio(description="a test server", env={"MCP_EXTRA_TOOLS": "200"}),
                  stdio("other"))
    try:
        box = ToolBox(*builtin_tools(), *mcp_tools(servers))
        assert len(box) == len(builtin_tools()) + 2
        call = box.get("mcp_call")
        assert "test (a test server); other" in call.description
        assert len(json.dumps([s.model_dump() for s in box.specs()])) < 12_000
        listed = await box.get("mcp_tools").run(context(store), {"server": "test"})
        tools = json.loads(listed.content)
        assert len(tools) == 207 and not listed.is_error
        add = next(t for t in tools if t["name"] == "add")
        assert add["arguments"]["required"] == ["a", "b"] and add["replay"] == "unsafe"
        assert "title" not in json.dumps(add["arguments"])
        done = await call.run(context(store), {"server": "test", "tool": "add",
                                               "arguments": {"a": 1, "b": 2}})
        assert (done.content, done.is_error) == ("3", False)
        wrong = await call.run(context(store), {"server": "test", "tool": "nope"})
        assert wrong.is_error and "has no tool 'nope'" in wrong.content and "add" in wrong.content
        bad = await call.run(context(store), {"server": "test", "tool": "add",
                                              "arguments": {"a": "x"}})
        assert bad.is_error and "validation" in bad.content
        nowhere = await call.run(context(store), {"server": "elsewhere", "tool": "add"})
        assert nowhere.is_error and "servers are: test, other" in nowhere.content
    finally:
        await servers.close()


def test_each_mcp_tool_keeps_its_own_replay_policy():
    servers = hub(stdio(policy="safe", tools={"record": "unsafe", "charge": "keyed"}))
    call = tools_of(servers)["mcp_call"]
    assert call.policy_for({"server": "test", "tool": "add"}) == Policy.SAFE
    assert call.policy_for({"server": "test", "tool": "record"}) == Policy.UNSAFE
    assert call.policy_for({"server": "test", "tool": "charge"}) == Policy.KEYED
    assert call.policy_for({"server": "gone", "tool": "x"}) == Policy.SAFE  # an error only
    default = tools_of(hub(stdio()))["mcp_call"]
    assert default.policy_for({"server": "test", "tool": "add"}) == Policy.UNSAFE
    assert READS_OUTSIDE in call.touches  # what a server returns is data from outside


async def test_mcp_tools_ask_first_after_outside_text_unless_trusted():
    """Replay is not trust: a `safe` tool asks after outside text like an unsafe one; only
    a tool the owner lists in `trusted` runs unasked."""
    call = tools_of(hub(stdio(tools={"add": "safe"}, trusted=["record"])))["mcp_call"]
    read = Asking(Recipients(), read_outside="http_get")
    asked = await call.approval(read, {"server": "test", "tool": "add",
                                       "arguments": {"a": 1, "b": 2}})
    assert asked and "after reading text from outside" in asked
    assert await call.approval(read, {"server": "test", "tool": "record"}) is None
    everything = tools_of(hub(stdio(trusted=["*"])))["mcp_call"]
    assert await everything.approval(read, {"server": "test", "tool": "add"}) is None
    assert await call.approval(Asking(Recipients()), {"server": "test", "tool": "add"}) is None
    assert await call.approval(Asking(Recipients()), {"server": "test",
                                                      "tool": "record"}) is None


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_keyed_tool_gets_the_same_key_every_time(store, ledger):
    servers = hub(stdio(tools={"charge": "keyed"}))
    try:
        call = tools_of(servers)["mcp_call"]
        for _ in range(2):  # the runtime's retry of the same task: the same key
            await call.run(context(store, "turn9.1.0"),
                           {"server": "test", "tool": "charge", "arguments": {"amount": 5}})
        assert lines(ledger) == ["charge 5 turn9.1.0", "charge 5 turn9.1.0"]
    finally:
        await servers.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_server_that_dies_mid_call_is_reported_and_restarted(store, ledger):
    servers = hub(stdio())
    server = servers.get("test")
    try:
        call = tools_of(servers)["mcp_call"]
        died = await call.run(context(store), {"server": "test", "tool": "die"})
        assert died.is_error and died.content.startswith("error: interrupted:")
        assert "may or may not have taken effect" in died.content
        started = time.monotonic()
        again = await call.run(context(store), {"server": "test", "tool": "add",
                                                "arguments": {"a": 1, "b": 1}})
        assert (again.content, again.is_error) == ("2", False)
        assert server.connects == 2
        assert time.monotonic() - started < 10  # the first backoff is a second
    finally:
        await servers.close()


async def test_a_server_that_cannot_start_takes_nothing_down(caplog):
    servers = hub({"name": "broken", "command": "/nonexistent/mcp-server",
                   "connect_timeout_seconds": 1.5})
    try:
        started = time.monotonic()
        with pytest.raises(Unreachable, match="broken.*not reachable"):
            await servers.get("broken").list_tools()
        assert time.monotonic() - started < 5
        await asyncio.sleep(0.1)
        assert "mcp: broken is down" in caplog.text
    finally:
        await servers.close()


@pytest.fixture
async def http_server(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MCP_LEDGER": str(tmp_path / "ledger")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *SERVER, "--http", "0", env=env, stderr=asyncio.subprocess.PIPE)
    line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
    port = int(re.search(r"listening on (\d+)", line).group(1))
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_streamable_http_server_with_a_header_from_the_environment(store,
                                                                          http_server):
    servers = hub({"name": "remote", "url": http_server,
                   "headers_env": {"Authorization": "REMOTE_AUTH"}},
                  env={"REMOTE_AUTH": "Bearer s3cret"})
    try:
        call = tools_of(servers)["mcp_call"]
        who = await call.run(context(store), {"server": "remote", "tool": "whoami"})
        assert (who.content, who.is_error) == ("Bearer s3cret", False)
        add = await call.run(context(store), {"server": "remote", "tool": "add",
                                              "arguments": {"a": 20, "b": 22}})
        assert add.content == "42"
    finally:
        await servers.close()


def test_the_config_is_checked():
    from pydantic import ValidationError

    for bad, why in [({"name": "x"}, "either command"),
                     ({"name": "x", "command": "a", "url": "http://h/mcp"}, "either command"),
                     ({"name": "bad name", "command": "a"}, "letters, digits"),
                     ({"name": "x", "url": "ftp://h"}, "http"),
                     ({"name": "x", "command": "a", "policy": "maybe"}, "safe"),
                     ({"name": "x", "command": "a", "pass_env": ["NOT-A-NAME"]}, "names")]:
        with pytest.raises(ValidationError, match=why):
            McpConfig.model_validate({"servers": [bad]})
    with pytest.raises(ValidationError, match="used twice"):
        McpConfig.model_validate({"servers": [{"name": "a", "command": "x"},
                                              {"name": "a", "command": "y"}]})
