"""Reminders reach the terminal: `steward run` prints what it delivers to the terminal
(a reminder fires, an answer resumed for `ask` that has gone), and `chat` fires due
schedules itself (each occurrence still fires once: its commit is keyed) and shows them
between turns. Real `steward` subprocesses, the offline demo model, schedules due in a
second or two."""

import asyncio
import json
import signal
import sys

import pytest

from tests.test_chat_interrupt import start_chat
from tests.test_cli import steward, steward_env


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


class Reader:
    """A process's output read up to a marker at a time, nothing read past it lost."""

    def __init__(self, stream):
        self.stream = stream
        self.buffer = b""

    async def until(self, marker: bytes, seconds: float = 60) -> bytes:
        async with asyncio.timeout(seconds):
            while marker not in self.buffer:
                chunk = await self.stream.read(1024)
                assert chunk, f"ended before {marker!r}: {self.buffer!r}"
                self.buffer += chunk
        end = self.buffer.index(marker) + len(marker)
        seen, self.buffer = self.buffer[:end], self.buffer[end:]
        return seen


async def remind(home, session: str, what: str, seconds: int = 3) -> None:
    code, out, err = await steward(home, "ask", "--session", session,
                                   f"remind me in {seconds} seconds to {what}")
    assert code == 0 and "Scheduled" in out, out + err


async def test_run_prints_a_reminder_when_it_fires(home):
    await remind(home, "cli:default", "stretch")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        shown = await Reader(proc.stdout).until(b"Reminder: stretch.\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)
    err = (await proc.stderr.read()).decode()
    lines = shown.decode().splitlines()
    assert any(line.startswith("steward: running on sqlite") for line in lines), err
    assert [line for line in lines if not line.startswith("steward: ")] == [
        "[cli:default] Reminder: stretch."], err
    code, out, _ = await steward(home, "schedules", "--all", "--json")
    assert out.count('"fired": 1') == 1, out  # once


async def test_a_reminder_due_before_the_model_answered_is_set_not_refused(home):
    # "In 0 seconds" has passed by the time the tool runs, as "in 1 second" does on a slow
    # model or a loaded machine: due at once, and shown by the next `run`.
    await remind(home, "cli:default", "stretch", seconds=0)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await Reader(proc.stdout).until(b"[cli:default] Reminder: stretch.\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 60)


async def test_chat_fires_due_reminders_and_shows_them_between_turns(home):
    await remind(home, "cli:errands", "buy stamps")  # another session's
    proc = await start_chat(home)
    out = Reader(proc.stdout)
    try:
        shown = await out.until(b"[cli:errands] Reminder: buy stamps.\n")
        assert shown.startswith(b"steward chat"), shown
        # One of its own session, asked for in the chat: shown at the prompt, unprefixed.
        proc.stdin.write(b"remind me in 3 seconds to stretch\n")
        await proc.stdin.drain()
        shown = await out.until(b"Reminder: stretch.\n")
        assert b"Scheduled 'stretch'" in shown and b"[cli:talk]" not in shown, shown
        shown += await out.until(b"you> ")  # the prompt again, for the person
        assert shown.endswith(b"Reminder: stretch.\nyou> "), shown
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = (await proc.stderr.read()).decode()
    assert proc.returncode == 0, err
    code, out, _ = await steward(home, "schedules", "--all", "--json")
    assert out.count('"fired": 1') == 2, out  # each once


async def test_with_run_and_chat_both_up_a_reminder_fires_once(home):
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    chat = await start_chat(home)
    try:
        await Reader(run.stdout).until(b"steward: running")
        await Reader(chat.stdout).until(b"you> ")
        await remind(home, "cli:default", "stretch")
        for _ in range(120):  # each look is a `steward log` of its own
            code, out, err = await steward(home, "log", "cli:default", "--json")
            said = [json.loads(line)["text"] for line in out.splitlines()]
            if "Reminder: stretch." in said:
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(said)
        await asyncio.sleep(3)  # a second firing would be there by now
        code, out, err = await steward(home, "log", "cli:default", "--json")
        said = [json.loads(line)["text"] for line in out.splitlines()]
        assert said.count("Reminder: stretch.") == 1, said
        code, out, _ = await steward(home, "schedules", "--all", "--json")
        assert [json.loads(line)["fired"] for line in out.splitlines()] == [1], out
    finally:
        chat.stdin.close()
        run.send_signal(signal.SIGTERM)
        await asyncio.wait_for(asyncio.gather(chat.wait(), run.wait()), 60)
    assert (chat.returncode, run.returncode) == (0, 0)
