"""bot/app/allocator.py: the malloc settings apply on glibc, are skipped cleanly elsewhere,
and the trim loop runs off the event loop and stops when cancelled."""

import asyncio
import threading

import pytest

from bot.app import allocator
from bot.app.allocator import Allocator, load_glibc

glibc = pytest.mark.skipif(load_glibc() is None, reason="Linux with glibc only")


@glibc
def test_arena_cap_applies_on_glibc(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert Allocator(load_glibc()).configure(allocator.ARENA_MAX) is True  # mallopt -> 1


@glibc
def test_the_environment_variable_wins(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert Allocator(load_glibc()).configure() is False


@glibc
def test_trim_calls_malloc_trim():
    assert isinstance(Allocator(load_glibc()).trim(), bool)


class _NotGlibc:
    """A C library with malloc but none of glibc's extras (musl, macOS's libSystem)."""

    def malloc(self, size):
        return 0


def test_elsewhere_everything_is_skipped():
    assert load_glibc(find=lambda _name: None) is None
    assert load_glibc(find=lambda _name: "libc.so", load=lambda _name: _NotGlibc()) is None

    def missing(_name):
        raise OSError("no such library")

    assert load_glibc(find=lambda _name: "libc.so", load=missing) is None
    nothing = Allocator(None)
    assert not nothing.supported
    assert nothing.configure() is False
    assert nothing.trim() is False


async def test_trim_loop_returns_at_once_where_unsupported():
    await asyncio.wait_for(Allocator(None).trim_periodically(0.0), 5)


class _RecordingLibc:
    """malloc_trim records its thread; the second call cancels the loop (from that thread,
    while the loop awaits it), so no call can be in flight once the task has ended."""

    def __init__(self):
        self.threads: list[int] = []
        self.loop = asyncio.get_running_loop()
        self.task: asyncio.Task | None = None

    def malloc_trim(self, pad):
        assert pad == 0
        self.threads.append(threading.get_ident())
        if len(self.threads) == 2:
            self.loop.call_soon_threadsafe(self.task.cancel)
        return 1


async def test_trim_loop_runs_off_the_loop_and_stops_on_cancel():
    libc = _RecordingLibc()
    libc.task = asyncio.create_task(Allocator(libc).trim_periodically(0.001))
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(libc.task, 10)
    assert len(libc.threads) == 2
    assert threading.get_ident() not in libc.threads
    for _ in range(20):
        await asyncio.sleep(0.001)
    assert len(libc.threads) == 2
