"""Ctrl-C in `chat`: a real `steward chat` subprocess, its stdin a pipe that stays open
(nobody types Enter), sent SIGINT. At the prompt it leaves at once; during an answer the
first Ctrl-C says it finishes the answer (and does, showing it), a second stops now, leaves
no task shown as running, and the next start finishes the answer and shows it."""

import asyncio
import json
import signal
import sys
import time

import pytest

from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.test_cli import interruptible, steward, steward_env


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


async def read_until(stream, marker: bytes) -> bytes:
    seen = b""
    async with asyncio.timeout(60):
        while marker not in seen:
            chunk = await stream.read(1024)
            if not chunk:
                break
            seen += chunk
    return seen


async def start_chat(home):
    # faulthandler: a chat that does not leave is aborted with every thread's stack shown
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "chat", "--session", "cli:talk",
        env=steward_env(home, PYTHONFAULTHANDLER="1"), cwd=home, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=interruptible)


async def left(proc, seconds: float) -> None:
    """Wait for the process to exit; if it does not, fail with where its threads are."""
    try:
        await asyncio.wait_for(proc.wait(), seconds)
    except TimeoutError:
        proc.send_signal(signal.SIGABRT)
        await asyncio.wait_for(proc.wait(), 30)
        err = (await proc.stderr.read()).decode()
        raise AssertionError(f"still running {seconds:.0f} s after SIGINT:\n{err}") from None


async def test_ctrl_c_at_the_prompt_leaves_at_once(home):
    proc = await start_chat(home)
    try:
        shown = await read_until(proc.stdout, b"you> ")
        assert shown.endswith(b"you> "), shown
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        await left(proc, 10)
        took = time.monotonic() - sent
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    rest = (await proc.stdout.read()).decode()
    err = (await proc.stderr.read()).decode()
    assert proc.returncode == 130, err
    assert took < 5, f"{took:.1f} s"
    assert "Traceback" not in err + rest, err
    assert rest == "\n"  # off the prompt's line, nothing else


async def test_ctrl_c_after_an_answer_leaves_and_keeps_the_conversation(home):
    proc = await start_chat(home)
    try:
        await read_until(proc.stdout, b"you> ")
        proc.stdin.write(b"first thing\n")
        await proc.stdin.drain()
        shown = await read_until(proc.stdout, b"you> ")
        assert b'You said: "first thing"' in shown
        proc.send_signal(signal.SIGINT)
        await left(proc, 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = (await proc.stderr.read()).decode()
    assert proc.returncode == 130 and "Traceback" not in err, err
    check = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "log", "cli:talk", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(check.communicate(), 60)
    kinds = [line.split()[2].rstrip(":") for line in out.decode().splitlines()]
    assert kinds == ["user", "assistant"]


# -- Ctrl-C while an answer streams: a fake provider streams it slowly ----------------------

STORY = " ".join(f"word{n}" for n in range(60)) + "."  # 60 chunks, 0.1 s apart: ~6 s


class SlowLLM:
    """The fake provider streaming STORY slowly; `asked` is told of each request as it
    comes (the server answers in a thread of its own)."""

    def __init__(self, server: FakeLLMServer):
        self.server = server
        self.asked: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def respond(_request, _wire):
            loop.call_soon_threadsafe(self.asked.put_nowait, None)
            return Reply(text=STORY, chunk_chars=8, delay=0.1)

        server.responder = respond

    async def streaming(self) -> None:
        """The provider has been asked: the answer is streaming now."""
        await asyncio.wait_for(self.asked.get(), 60)


@pytest.fixture
async def slow_llm(home):
    with FakeLLMServer() as server:
        (home / "config.toml").write_text(
            f'[llm]\nprovider = "openai"\nbase_url = "{server.url}/v1"\nmodel = "m"\n')
        yield SlowLLM(server)


async def start_answer(home, llm):
    proc = await start_chat(home)
    await read_until(proc.stdout, b"you> ")
    proc.stdin.write(b"tell me a story\n")
    await proc.stdin.drain()
    await llm.streaming()
    return proc


async def no_task_running(home) -> list[dict]:
    code, out, err = await steward(home, "tasks", "--json")
    assert code == 0, err
    found = [json.loads(line) for line in out.splitlines()]
    assert not [t for t in found if t["state"] == "running"], found
    return found


async def test_ctrl_c_during_an_answer_says_so_and_finishes_it(home, slow_llm):
    proc = await start_answer(home, slow_llm)
    try:
        proc.send_signal(signal.SIGINT)
        said = await read_until(proc.stderr, b"\n")
        assert said.decode().strip() == ("stopping: finishing the answer in progress… "
                                         "press Ctrl-C again to stop now")
        await left(proc, 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out = (await proc.stdout.read()).decode()
    err = (await proc.stderr.read()).decode()
    assert proc.returncode == 130, err
    assert out == STORY + "\n", out  # the whole answer, and no prompt after it
    assert "Traceback" not in err, err
    assert {t["state"] for t in await no_task_running(home)} == {"done"}


@pytest.mark.parametrize("next_start", ["chat", "resume"])
async def test_ctrl_c_twice_stops_now_and_the_next_start_shows_the_answer(
        home, slow_llm, next_start):
    proc = await start_answer(home, slow_llm)
    try:
        proc.send_signal(signal.SIGINT)
        await read_until(proc.stderr, b"press Ctrl-C again to stop now\n")
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        await left(proc, 30)
        took = time.monotonic() - sent
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    out = (await proc.stdout.read()).decode()
    err = (await proc.stderr.read()).decode()
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert took < 10, f"{took:.1f} s"
    assert STORY not in out
    assert "stopped: what was in progress resumes at the next start" in err, err
    # Nothing is shown as running with no process behind it: it waits to be resumed.
    assert "pending" in {t["state"] for t in await no_task_running(home)}

    if next_start == "resume":
        code, out, err = await steward(home, "resume")
        assert code == 0, err
        assert out.startswith(f"[cli:talk] {STORY}\n"), out
    else:
        again = await start_chat(home)
        try:
            shown = await read_until(again.stdout, STORY.encode() + b"\n")
            assert shown.startswith(b"steward chat"), shown
            again.stdin.close()
            await left(again, 60)
        finally:
            if again.returncode is None:
                again.kill()
                await again.wait()
        assert again.returncode == 0, (await again.stderr.read()).decode()
    await no_task_running(home)
    code, out, _ = await steward(home, "log", "cli:talk", "--json")
    said = [json.loads(line) for line in out.splitlines()]
    assert [(e["kind"], e["text"]) for e in said if e["kind"] != "system"][-1] == (
        "assistant", STORY)


async def test_a_task_whose_process_was_killed_shows_as_waiting_to_resume(home, slow_llm):
    with (home / "config.toml").open("a") as config:
        config.write("[runtime]\nlease_seconds = 1.0\n")
    proc = await start_answer(home, slow_llm)
    proc.kill()  # no chance to hand anything back
    await proc.wait()
    await asyncio.sleep(1.5)  # its lease, renewed by nobody now, has run out
    code, out, err = await steward(home, "tasks")
    assert code == 0, err
    states = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert not [line for line in states.values() if " running " in line], out
    assert [line for line in states.values() if "waiting to resume" in line], out
    code, out, err = await steward(home, "tasks", "--json")
    stalled = [json.loads(line) for line in out.splitlines() if json.loads(line)["stalled"]]
    assert {t["state"] for t in stalled} == {"running"}, out  # as the store has it
