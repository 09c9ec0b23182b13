"""Kill a real `steward ask` at every dangerous point of a turn, run `steward resume`, and
count: final answers in the log, requests at the fake LLM server, tool executions."""

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from tests.fakes.llm_server import FakeLLMServer, Reply

TESTS = Path(__file__).parent
SESSION = "cli:crash"


def script(request: dict, wire: str) -> Reply:
    """The model: first call both tools (in parallel), then answer from their results."""
    messages = request["messages"]
    last = messages[-1]
    tool_results = last["role"] == "tool" or (
        wire == "anthropic" and isinstance(last["content"], list)
        and any(b.get("type") == "tool_result" for b in last["content"]))
    if not tool_results:
        return Reply(text="Let me check both.", chunk_chars=3, delay=0.03,
                     tool_calls=[("call_1", "safe_probe", {"target": "the roof"}),
                                 ("call_2", "unsafe_charge", {"amount": 42})])
    return Reply(text="All done: the roof looks fine and the card was handled.",
                 chunk_chars=4, delay=0.03)


@pytest.fixture
def llm():
    with FakeLLMServer(script) as server:
        yield server


def make_home(tmp_path: Path, store_url: str, llm_url: str, wire: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    base = f"{llm_url}/v1" if wire == "openai" else llm_url
    (home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "{wire}"
base_url = "{base}"
model = "fake-model"
[agent]
tool_modules = ["crash_tools"]
approve_unsafe_custom_tools = false  # these tests are about crashes; approvals have theirs
[runtime]
concurrency = 1
lease_seconds = 2.0
retry_base_seconds = 0.05
retry_max_seconds = 0.1
""")
    return home


async def steward(home: Path, *args: str, kill_at: str | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), STEWARD_CONFIG=str(home / "config.toml"),
               STEWARD_TEST_LEDGER=str(home / "ledger"),
               PYTHONPATH=os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]))
    if kill_at:
        env["STEWARD_KILL_AT"] = kill_at
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=env, cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:  # generous: a life on a loaded machine may wait out a suspect's deferral too
        out, err = await asyncio.wait_for(proc.communicate(), 300)
    except TimeoutError:  # never left running beside the next life
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode, out.decode(), err.decode()


def ledger(home: Path) -> list[str]:
    path = home / "ledger"
    return [line.split()[0] for line in path.read_text().splitlines()] if path.exists() else []


async def transcript(home: Path) -> list[dict]:
    code, out, err = await steward(home, "log", SESSION, "--json", "--limit", "100")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


# point -> (LLM requests, safe_probe runs, unsafe_charge runs, unsafe interrupted)
POINTS = {
    "mid-stream:llm_call": (3, 1, 1, False),
    "after-result:llm_call": (2, 1, 1, False),
    "after-phase:turn.after_tools": (2, 1, 1, False),
    "in-tool:safe_probe": (2, 2, 1, False),
    "in-tool:unsafe_charge": (2, 1, 1, True),
    # The tool results, committed with the second model request (the state between them
    # is gone: they land together).
    "after-phase:turn.after_llm#2": (2, 1, 1, False),
    "after-phase:turn.after_llm": (2, 1, 1, False),
    "after-phase:turn.delivered": (2, 1, 1, False),
    "after-result:deliver": (2, 1, 1, False),
}


@pytest.mark.parametrize("point", list(POINTS))
async def test_turn_survives_sigkill(store_url, tmp_path, llm, point):
    requests, safe_runs, unsafe_runs, interrupted = POINTS[point]
    home = make_home(tmp_path, store_url, llm.url, "openai")
    code, _, err = await steward(home, "ask", "--session", SESSION, "check the roof and pay",
                                 kill_at=point)
    assert code == -signal.SIGKILL, err[-2000:]
    code, out, err = await steward(home, "resume")
    assert code == 0, err[-3000:]

    entries = await transcript(home)
    finals = [e for e in entries if e["kind"] == "assistant" and (e["data"] or {}).get("final")]
    assert len(finals) == 1, entries
    assert finals[0]["text"].startswith("All done")
    assert llm.count("/v1/chat/completions") == requests
    runs = ledger(home)
    assert (runs.count("safe_probe"), runs.count("unsafe_charge")) == (safe_runs, unsafe_runs)
    results = {(e["data"] or {}).get("name"): e["text"] for e in entries
               if e["kind"] == "tool_result"}
    if interrupted:  # the agent was told, and the final request carried it
        assert "interrupted" in results["unsafe_charge"]
        last_request = llm.requests[-1].body["messages"]
        assert any("interrupted" in m.get("content", "") for m in last_request
                   if m["role"] == "tool")
    else:
        assert results["unsafe_charge"] == "charged 42"
    assert results["safe_probe"] == "the roof looks fine"
    aborted = [e for e in entries if e["kind"] == "aborted"]
    assert len(aborted) == (1 if point.startswith("mid-stream") else 0)

    code, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
    states = {json.loads(line)["state"] for line in out.splitlines()}
    assert states == {"done"} or (interrupted and states == {"done", "interrupted"})


async def test_anthropic_wire_survives_an_interrupted_unsafe_tool(store_url, tmp_path, llm):
    home = make_home(tmp_path, store_url, llm.url, "anthropic")
    code, _, err = await steward(home, "ask", "--session", SESSION, "check the roof and pay",
                                 kill_at="in-tool:unsafe_charge")
    assert code == -signal.SIGKILL, err[-2000:]
    code, out, err = await steward(home, "resume")
    assert code == 0, err[-3000:]
    assert "[cli:crash] All done" in out  # the terminal shows the one answer
    entries = await transcript(home)
    assert [e["kind"] for e in entries] == [
        "user", "assistant", "tool_result", "tool_result", "assistant"]
    assert llm.count("/v1/messages") == 2
    assert ledger(home).count("unsafe_charge") == 1


async def test_same_request_id_answers_once(store_url, tmp_path, llm):
    home = make_home(tmp_path, store_url, llm.url, "openai")
    outputs = []
    for _ in range(2):
        code, out, err = await steward(home, "ask", "--session", SESSION, "--request-id",
                                       "r-1", "check the roof and pay")
        assert code == 0, err[-2000:]
        outputs.append(out.strip().splitlines()[-1])
    assert outputs[0] == outputs[1] == "All done: the roof looks fine and the card was handled."
    assert llm.count("/v1/chat/completions") == 2
    assert ledger(home) == ["safe_probe", "unsafe_charge"]
    entries = await transcript(home)
    assert [e["kind"] for e in entries].count("user") == 1
