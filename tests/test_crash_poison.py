"""A message whose turn kills the process every time it runs (a poison) must end, without
taking anything else with it: restarted again and again (as a service manager would),
Steward quarantines the task after `crash_limit` deaths spanning `crash_window_seconds`,
the person is told once, and the messages behind it, in its conversation and others, are
each answered once. The quarantine comes only after deaths spanning the window: both the
test's clock and the reason Steward gives say so."""

import json
import re
import signal
import time

from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.test_crash_agent import make_home, steward

WINDOW = 2.0
LIMIT = 5
REASON = re.compile(r"quarantined: the process died (\d+) times while running it, "
                    r"over (\d+) s")


def script(request: dict, _wire: str) -> Reply:
    """Asked to "swallow the pill", the model calls the tool that kills the process; told
    a tool failed, it says so; anything else is echoed."""
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(text=f"That did not work: {last['content']}")
    if "swallow the pill" in last["content"]:
        return Reply(text="", tool_calls=[("call_1", "crash_now", {"what": "the pill"})])
    return Reply(text=f"echo: {last['content']}")


def configure(tmp_path, store_url, llm, *, limit: int = LIMIT, window: float = WINDOW
              ) -> object:
    home = make_home(tmp_path, store_url, llm.url, "openai")
    config = home / "config.toml"
    config.write_text(config.read_text().replace("concurrency = 1", "concurrency = 4")
                      + f"crash_window_seconds = {window}\ncrash_limit = {limit}\n")
    return home


async def log_of(home, session: str) -> list[dict]:
    code, out, err = await steward(home, "log", session, "--json", "--limit", "100")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


def finals(entries: list[dict]) -> list[str]:
    return [e["text"] for e in entries
            if e["kind"] == "assistant" and (e["data"] or {}).get("final")]


def judged_over_the_window(told: str, elapsed: float, *, limit: int = LIMIT,
                           window: float = WINDOW) -> None:
    """The quarantine (its reason in `told`) came after `crash_limit` deaths at least,
    spanning the window (as the runtime measured it, rounded to the second, and as the
    test's clock did from before the first life)."""
    found = REASON.search(told)
    assert found, told
    deaths, seconds = int(found.group(1)), int(found.group(2))
    assert deaths >= limit and seconds >= round(window), told
    assert elapsed >= window, elapsed


async def ask_until_stored(home, session: str, text: str, *, kill_at: str | None = None):
    """`steward ask` for a message behind a poison: a life can die before `ask` has stored
    it (the poison may run first), so asked again with the same request id until it is."""
    for _ in range(10):
        code, _, err = await steward(home, "ask", "--session", session, "--request-id", text,
                                     text, kill_at=kill_at)
        assert code in (0, -signal.SIGKILL), err[-2000:]
        code, out, err = await steward(home, "log", session, "--json", "--limit", "100")
        if code == 1 and "no conversation" in err:  # the life died before making it
            continue
        assert code == 0, err
        if any(e["kind"] == "user" and e["text"] == text
               for e in map(json.loads, out.splitlines())):
            return
    raise AssertionError(f"{text!r} was never stored")


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
        started = time.monotonic()
        code, _, err = await steward(home, "ask", "--session", "cli:a", "swallow the pill")
        assert code == -signal.SIGKILL, err[-2000:]
        # Behind it in its own conversation, and in another one; each of these lives dies
        # too, while the poison is still being tried.
        for session, text in (("cli:a", "then say one"), ("cli:b", "say two")):
            await ask_until_stored(home, session, text)
        codes = await until_resumed(home)
        elapsed = time.monotonic() - started

        a, b = await log_of(home, "cli:a"), await log_of(home, "cli:b")
        told = finals(a)[0]
        assert told.startswith("That did not work: error: the tool call failed: "
                               "quarantined: the process died "), told
        judged_over_the_window(told, elapsed)
        assert finals(a)[1:] == ["echo: then say one"]
        assert finals(b) == ["echo: say two"]
        pill_runs = [line for line in (home / "ledger").read_text().splitlines()
                     if line.startswith("crash_now")]
        assert len(pill_runs) >= LIMIT and codes[-1] == 0
        code, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
        states = sorted(json.loads(line)["state"] for line in out.splitlines())
        assert states.count("failed") == 1 and set(states) == {"done", "failed"}, states


def asked(llm, text: str) -> int:
    """How many requests at the model were for `text` (their last message)."""
    return sum(1 for r in llm.requests if r.body["messages"][-1].get("content") == text)


async def test_a_turn_that_kills_every_life_tells_the_person_once(store_url, tmp_path):
    """Here the window, not the count, is what holds the quarantine back: two deaths would
    do, but a life takes about a second or two, so they span less than the window."""
    limit, window = 2, 4.0
    with FakeLLMServer(script) as llm:
        home = configure(tmp_path, store_url, llm, limit=limit, window=window)
        point = "in-phase:turn.after_llm"
        started = time.monotonic()
        code, _, err = await steward(home, "ask", "--session", "cli:p", "hello",
                                     kill_at=point)
        assert code == -signal.SIGKILL, err[-2000:]
        # Behind it in the same conversation: its turn waits for the poison's to end.
        await ask_until_stored(home, "cli:p", "then say one", kill_at=point)
        # Every life dies at the kill point until the poison is quarantined and the turn
        # behind it has asked the model (that life dies at the same point, in that turn).
        codes = []
        while not asked(llm, "then say one"):
            assert len(codes) < 40, codes
            code, _, err = await steward(home, "resume", kill_at=point)
            assert code in (0, -signal.SIGKILL), err[-3000:]
            codes.append(code)
        elapsed = time.monotonic() - started
        # Then lives without the kill point: the message behind it is answered.
        await until_resumed(home)
        entries = await log_of(home, "cli:p")
        told = finals(entries)
        assert len(told) == 2 and told[0].startswith(
            "Sorry, I had to stop working on this message: Steward crashed each time it "
            "tried (quarantined: the process died "), told
        judged_over_the_window(told[0], elapsed, limit=limit, window=window)
        assert told[1] == "echo: then say one", told
        assert asked(llm, "then say one") == 1 and asked(llm, "hello") == 1
        # Once more, now without the poison: nothing is left to do, nothing is said again.
        assert (await steward(home, "resume"))[0] == 0
        assert len(finals(await log_of(home, "cli:p"))) == 2
        code, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
        assert {json.loads(line)["state"] for line in out.splitlines()} == {"done"}
