"""SIGKILL of a real `steward ask` in the middle of an MCP call (the server, written with
the SDK, has recorded `start` and is still working): after `steward resume`, an unsafe MCP
tool was called once and the model is told it was interrupted; one declared `safe` is
called again and its result used. Exact counts from the server's own ledger."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.fakes.llm_server import FakeLLMServer, Reply

ROOT = Path(__file__).parent.parent
SESSION = "cli:mcp"


def script(request: dict, _wire: str) -> Reply:
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(text=f"Finished: {last['content']}")
    if "record it" in last["content"]:
        return Reply(text="", tool_calls=[("call_1", "mcp_call", {
            "server": "ledger", "tool": "slow_record",
            "arguments": {"text": "x", "seconds": 2.0}})])
    return Reply(text=f"echo: {last['content']}")


@pytest.fixture
def llm():
    with FakeLLMServer(script) as server:
        yield server


def make_home(tmp_path: Path, store_url: str, llm_url: str, policy: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    env = {"PYTHONPATH": str(ROOT), "MCP_LEDGER": str(home / "ledger")}
    (home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "openai"
base_url = "{llm_url}/v1"
model = "fake-model"
[agent]
approve_unsafe_custom_tools = false  # about crashes; approvals are tested elsewhere
[[mcp.servers]]
name = "ledger"
command = {json.dumps(sys.executable)}
args = ["-m", "tests.fakes.mcp_server"]
env = {{ {", ".join(f'{k} = {json.dumps(v)}' for k, v in env.items())} }}
tools = {{ slow_record = "{policy}" }}
[runtime]
lease_seconds = 2.0
retry_base_seconds = 0.05
retry_max_seconds = 0.1
""")
    return home


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), STEWARD_CONFIG=str(home / "config.toml"))
    return env


def ledger(home: Path) -> list[str]:
    path = home / "ledger"
    return path.read_text().splitlines() if path.exists() else []


async def steward(home: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=environment(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize(("policy", "calls", "told"), [
    ("unsafe", 1, "interrupted"),  # never repeated blindly
    ("safe", 2, "slowly recorded x"),  # declared safe to repeat: repeated, and its answer
])
async def test_sigkill_mid_mcp_call(store_url, tmp_path, llm, policy, calls, told):
    home = make_home(tmp_path, store_url, llm.url, policy)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "ask", "--session", SESSION, "record it",
        env=environment(home), cwd=home, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    deadline = time.monotonic() + 60
    while "start x" not in ledger(home):
        assert time.monotonic() < deadline and proc.returncode is None, \
            (await proc.stderr.read()).decode()[-3000:]
        await asyncio.sleep(0.02)
    proc.send_signal(signal.SIGKILL)  # mid-call: the server is still working on it
    assert await proc.wait() == -signal.SIGKILL

    code, out, err = await steward(home, "resume")
    assert code == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    await asyncio.sleep(2.5)  # let an orphaned call finish, so the ledger is final
    assert [line for line in ledger(home) if line.startswith("start")] == ["start x"] * calls
    code, out, err = await steward(home, "log", SESSION, "--json", "--limit", "100")
    entries = [json.loads(line) for line in out.splitlines()]
    finals = [e["text"] for e in entries
              if e["kind"] == "assistant" and (e["data"] or {}).get("final")]
    assert len(finals) == 1 and told in finals[0], entries


async def test_the_prompt_prefix_stays_byte_identical_with_mcp_servers(store_url, tmp_path,
                                                                       llm):
    """The system prompt and the tool list are the cache's prefix: the same bytes before
    any server is connected, while one is, and after it restarted."""
    home = make_home(tmp_path, store_url, llm.url, "safe")
    for text in ("hello", "record it", "and again"):
        code, _, err = await steward(home, "ask", "--session", SESSION, text)
        assert code == 0, err[-3000:]
    bodies = [r.body for r in llm.requests]
    assert len(bodies) == 4  # hello; record it (a tool call, then the answer); again
    prefixes = {json.dumps([b["messages"][0], b["tools"]], sort_keys=True) for b in bodies}
    assert len(prefixes) == 1
    assert "Servers: ledger." in json.dumps(bodies[0]["tools"])
