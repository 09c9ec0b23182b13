"""Ctrl-C at the `chat` prompt leaves at once: a real `steward chat` subprocess, its stdin
a pipe that stays open (nobody types Enter), sent SIGINT."""

import asyncio
import signal
import sys
import time

import pytest

from tests.test_cli import steward_env


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


def _interruptible() -> None:
    # A shell that starts the suite in the background without job control has SIGINT
    # ignored, and a child inherits that (Python then leaves Ctrl-C alone, as it should);
    # the person at this prompt has a terminal whose Ctrl-C is delivered.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def start_chat(home):
    # faulthandler: a chat that does not leave is aborted with every thread's stack shown
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "chat", "--session", "cli:talk",
        env=steward_env(home, PYTHONFAULTHANDLER="1"), cwd=home, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        preexec_fn=_interruptible)


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
