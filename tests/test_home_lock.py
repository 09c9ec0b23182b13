"""One `steward run` per home: a second (the service and a manual run, say) is refused with
the pid of the first, and the lock dies with its holder, however it dies. Real `steward`
subprocesses."""

import asyncio
import signal
import sys

import pytest

from tests.test_cli import steward, steward_env


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


async def start_run(home) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def serving(proc) -> None:
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line.startswith(b"steward: running on sqlite"), (
        line + await proc.stderr.read()).decode()


async def stop(proc, sig=signal.SIGTERM) -> None:
    if proc.returncode is None:
        proc.send_signal(sig)
        await asyncio.wait_for(proc.wait(), 60)


async def test_a_second_run_on_a_home_is_refused_with_the_pid_of_the_first(home):
    first = await start_run(home)
    try:
        await serving(first)
        second = await start_run(home)
        out, err = await asyncio.wait_for(second.communicate(), 60)
        assert second.returncode == 1, err
        assert out == b""
        line = err.decode().strip()
        assert line.startswith(f"steward: this home ({home}) is already served by "
                               f"`steward run`, pid {first.pid}"), line
        assert first.returncode is None  # the first goes on as if nothing happened
        # The other commands still share the home with it.
        code, out, err = await steward(home, "ask", "hello")
        assert code == 0 and out.startswith('You said: "hello"'), err
    finally:
        await stop(first)
    assert first.returncode == 0


async def test_the_lock_dies_with_its_holder(home):
    first = await start_run(home)
    try:
        await serving(first)
    finally:
        await stop(first, signal.SIGKILL)
    again = await start_run(home)  # at once: nothing to wait out
    try:
        await serving(again)
    finally:
        await stop(again)
    assert again.returncode == 0
    after = await start_run(home)  # and after a clean stop
    try:
        await serving(after)
    finally:
        await stop(after)
