"""A message whose turn kills the process every time it runs (a poison) must end, without
taking anything else with it: restarted again and again (as a service manager would),
Steward quarantines the task after `crash_limit` deaths spanning `crash_window_seconds`,
the person is told once, and the messages behind it, in its conversation and others, are
each answered once."""

import json
import signal

from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.test_crash_agent import make_home, steward

WINDOW = 2.0


def script(request: dict, _wire: str) -> Reply:
    """Asked to "swallow the pill", the model calls the tool that kills the process; told
    a tool failed, it says so; anything else is echoed."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(text=f"That did not work: {last['content']}")
    if "swallow the pill" in last["content"]:
        return Reply(text="", tool_calls=[("call_1", "crash_now", {"what": "the pill"})])
    return Reply(text=f"echo: {last['content']}")


def configure(tmp_path, store_url, llm) -> object:
    home = make_home(tmp_path, store_url, llm.url, "openai")
    config = home / "config.toml"
    config.write_text(config.read_text().replace("concurrency = 1", "concurrency = 4")
                      + f"crash_window_seconds = {WINDOW}\ncrash_limit = 5\n")
    return home


async def log_of(home, session: str) -> list[dict]:
    code, out, err = await steward(home, "log", session, "--json", "--limit", "100")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def finals(entries: list[dict]) -> list[str]:
    return [e["text"] for e in entries
            if e["kind"] == "assistant" and (e["data"] or {}).get("final")]


async def until_resumed(home, *, kill_at: str | None = None) -> list[int]:
    codes: list[int] = []
    while not codes or codes[-1] != 0:
        assert len(codes) < 40, codes
        code, _, err = await steward(home, "resume", kill_at=kill_at)
        assert code in (0, -signal.SIGKILL), err[-3000:]
        codes.append(code)
    return codes


async def test_a_poison_tool_is_quarantined_and_the_queue_behind_it_answered(
        store_url, tmp_path):
    with FakeLLMServer(script) as llm:
        home = configure(tmp_path, store_url, llm)
        code, _, err = await steward(home, "ask", "--session", "cli:a", "swallow the pill")
        assert code == -signal.SIGKILL, err[-2000:]
        # Behind it in its own conversation, and in another one; each of these lives dies
        # too, while the poison is still being tried.
        for session, text in (("cli:a", "then say one"), ("cli:b", "say two")):
            # A life can die before `ask` has stored its message (the poison may run
            # first): asked again with the same request id until it is, answered once.
            for _ in range(10):
                code, _, err = await steward(home, "ask", "--session", session,
                                             "--request-id", text, text)
                assert code in (0, -signal.SIGKILL), err[-2000:]
                _, out, _ = await steward(home, "log", session, "--json", "--limit", "100")
                if any(e["kind"] == "user" and e["text"] == text
                       for e in map(json.loads, out.splitlines())):
                    break
        codes = await until_resumed(home)

        a, b = await log_of(home, "cli:a"), await log_of(home, "cli:b")
        told = finals(a)[0]
        assert told.startswith("That did not work: error: the tool call failed: "
                               "quarantined: the process died "), told
        assert finals(a)[1:] == ["echo: then say one"]
        assert finals(b) == ["echo: say two"]
        pill_runs = [line for line in (home / "ledger").read_text().splitlines()
                     if line.startswith("crash_now")]
        assert len(pill_runs) >= 5 and codes[-1] == 0
        code, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
        states = sorted(json.loads(line)["state"] for line in out.splitlines())
        assert states.count("failed") == 1 and set(states) == {"done", "failed"}, states


async def test_a_turn_that_kills_every_life_tells_the_person_once(store_url, tmp_path):
    with FakeLLMServer(script) as llm:
        home = configure(tmp_path, store_url, llm)
        point = "in-phase:turn.after_llm"
        code, _, err = await steward(home, "ask", "--session", "cli:p", "hello",
                                     kill_at=point)
        assert code == -signal.SIGKILL, err[-2000:]
        codes = await until_resumed(home, kill_at=point)
        assert codes.count(-signal.SIGKILL) >= 4
        entries = await log_of(home, "cli:p")
        told = finals(entries)
        assert len(told) == 1 and told[0].startswith(
            "Sorry, I had to stop working on this message: Steward crashed each time it "
            "tried (quarantined: the process died "), told
        # Once more, now without the poison: nothing is left to do, nothing is said again.
        assert (await steward(home, "resume"))[0] == 0
        assert len(finals(await log_of(home, "cli:p"))) == 1
        code, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
        assert {json.loads(line)["state"] for line in out.splitlines()} == {"done"}
