"""A real `steward run` as the service manager sees it: `READY=1` and watchdog pings over a
real notify socket (the pings come from the claim loop: a stopped process goes quiet),
`health.json` for `steward doctor`, a clean stop that says `STOPPING=1` and removes it —
and a loop that cannot go on (its database damaged under it) ends the process with exit 1
rather than leave it up and idle."""

import asyncio
import json
import signal
import socket
import sqlite3
import sys
import time

import pytest

from bot.app.doctor_checks import FAIL, OK, WARN, judge_health
from tests.test_cli import steward, steward_env


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


@pytest.fixture
def notify_socket(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    sock.setblocking(False)
    yield sock, path
    sock.close()


async def received(sock: socket.socket, seconds: float) -> list[str]:
    """The datagrams that arrive within `seconds`."""
    got, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            got.append(sock.recv(4096).decode())
        except BlockingIOError:
            await asyncio.sleep(0.02)
    return got


async def until(sock: socket.socket, what: str, within: float = 30.0) -> list[str]:
    got, deadline = [], time.monotonic() + within
    while time.monotonic() < deadline:
        got += await received(sock, 0.1)
        if any(what in g for g in got):
            return got
    raise AssertionError(f"no {what!r} within {within} s: {got}")


async def test_run_tells_systemd_it_is_ready_and_pings_from_its_claim_loop(home, notify_socket):
    sock, path = notify_socket
    env = steward_env(home, NOTIFY_SOCKET=str(path), WATCHDOG_USEC="2000000")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=env, cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await until(sock, "READY=1")
        pings = [g for g in await received(sock, 4.0) if g == "WATCHDOG=1"]
        # The idle loop turns every 0.5 s; a ping at most every 0.5 s (a quarter period).
        assert len(pings) >= 4, pings
        health = json.loads((home / "health.json").read_text())
        assert health["pid"] == proc.pid
        assert {"runner", "scheduler"} <= set(health["loops"])
        code, out, _ = await steward(home, "doctor", "--json")
        rows = {r["check"]: r for r in map(json.loads, out.splitlines())}
        assert rows["service"]["status"] == "ok", rows["service"]
        assert f"pid {proc.pid}" in rows["service"]["detail"]
        # Stopped (as a hung process is): the pings stop with it; going on, they resume.
        proc.send_signal(signal.SIGSTOP)
        await received(sock, 0.3)  # what was on its way
        assert await received(sock, 1.5) == []
        proc.send_signal(signal.SIGCONT)
        await until(sock, "WATCHDOG=1", within=10)
        proc.send_signal(signal.SIGTERM)
        await until(sock, "STOPPING=1")
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        assert not (home / "health.json").exists()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_loop_that_cannot_go_on_ends_the_process_with_exit_1(home):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.startswith(b"steward: running on sqlite")
        # The database is damaged under it: not an outage to wait out, a fault.
        db = sqlite3.connect(home / "steward.db", timeout=30)
        db.execute("DROP TABLE tasks")
        db.commit()
        db.close()
        assert await asyncio.wait_for(proc.wait(), 60) == 1
        err = (await proc.stderr.read()).decode()
        assert "the runner loop ended" in err and "no such table" in err, err[-3000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_doctor_reads_what_health_says():
    import os

    now = time.time()
    ok = {"runner": {"state": "ok", "last_progress": now - 1, "outages": 2}}
    me = os.getpid()
    assert judge_health(None, now)[0] == OK
    status, detail, _ = judge_health({"pid": me, "updated_at": now - 1, "loops": ok,
                                      "connected": {"slack": True, "email": False}}, now)
    assert status == OK and "2 store outage(s) waited out" in detail
    assert "slack connected, email connecting" in detail
    assert judge_health({"pid": me, "updated_at": now - 90, "loops": ok}, now)[0] == FAIL
    waiting = {"runner": {"state": "waiting for the store", "outage_since": now - 40,
                          "error": "OperationalError: database or disk is full"}}
    status, detail, fix = judge_health({"pid": me, "updated_at": now, "loops": waiting}, now)
    assert status == WARN and "disk is full" in detail and "free space" in fix
    stalled = {"runner": {"state": "ok", "last_progress": now - 600}}
    assert judge_health({"pid": me, "updated_at": now, "loops": stalled}, now)[0] == FAIL
    gone = {"pid": 2 ** 22 + 12345, "updated_at": now, "loops": ok}  # above pid_max
    assert judge_health(gone, now)[0] == WARN
