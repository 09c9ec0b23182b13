"""The tests' PostgreSQL server (tests/pg_server.py): a throwaway one starts, takes the
tests' connections and is gone afterwards, even when its run is killed; a named server is
used as it is; a run with none at hand (here `STEWARD_TEST_PG_URL=own`) starts one, and
only one for all its xdist workers."""

import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import pytest

from tests import pg_server
from tests.test_cli_errors import closed_port

REPO = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def until(condition, what: str, deadline: float = 120.0) -> None:
    """Wait for `condition()` (a generous deadline: the machine may be loaded)."""
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"not within {deadline} s: {what}"
        await asyncio.sleep(0.1)


async def test_a_throwaway_server_takes_connections_and_is_gone_after():
    server = pg_server.Throwaway()
    url = await server.start()
    pid = server.cluster.pid()
    try:
        assert pid is not None and alive(pid)
        assert url.endswith(f":{server.cluster.port}/test")
        conn = await asyncpg.connect(pg_server.plain(url))
        try:
            assert await conn.fetchval("SELECT current_database()") == "test"
            available = await conn.fetchval(
                "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'")
            made = await conn.fetchval(
                "SELECT count(*) FROM pg_extension WHERE extname = 'vector'")
            assert made == available  # made up front wherever pgvector is installed
        finally:
            await conn.close()
        socket_dir = server.cluster.root
        assert any(p.name.startswith(".s.PGSQL.") for p in socket_dir.iterdir())
    finally:
        watchdog = server.watchdog
        await server.stop()
    # `pg_ctl stop` returned once the pid file was gone; the process ends a moment later
    await until(lambda: not alive(pid), "the server's process ended")
    assert not await asyncio.to_thread(server.cluster.root.exists)
    assert watchdog.poll() is not None  # its watchdog is ended with it


async def test_a_named_server_is_used_as_it_is_and_never_probed():
    named = f"postgresql+asyncpg://someone@127.0.0.1:{closed_port()}/theirs"
    assert await pg_server.resolve({pg_server.ENV: named}) == (named, None)


async def test_with_no_server_at_hand_one_is_started_and_one_that_answers_is_used():
    nothing = f"postgresql+asyncpg://postgres@127.0.0.1:{closed_port()}/test"
    assert not await pg_server.answers(nothing)
    url, server = await pg_server.resolve({}, local=nothing)
    try:
        assert server is not None and url == server.url
        assert await pg_server.answers(url)
        # the fast path: a local server that answers (trust auth, database `test`) is used
        assert await pg_server.resolve({}, local=url) == (url, None)
    finally:
        await server.stop()


async def test_a_killed_run_leaves_no_server_behind():
    """The run that started the server is SIGKILLed (no cleanup of its own): its watchdog
    stops the server and removes its directory."""
    code = ("import asyncio, sys\n"
            "from tests.pg_server import Throwaway\n"
            "async def main():\n"
            "    s = Throwaway()\n"
            "    await s.start()\n"
            "    print(s.cluster.pid(), s.cluster.root, flush=True)\n"
            "    await asyncio.sleep(3600)\n"
            "asyncio.run(main())\n")
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, cwd=REPO, stdout=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(run.stdout.readline(), 180)
    pid, root = int(line.split()[0]), Path(line.split()[1].decode())
    assert alive(pid) and await asyncio.to_thread(root.exists)
    run.send_signal(signal.SIGKILL)
    await run.wait()
    await until(lambda: not alive(pid) and not root.exists(), "the server stopped")


@pytest.fixture
def scratch():
    """A temporary directory the `postgres` user can reach (the server runs as it when
    the tests run as root)."""
    path = Path(tempfile.mkdtemp(prefix="steward-tmp-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


async def test_a_run_with_no_server_starts_one_for_all_its_workers(scratch):
    """`pytest -n 2` on PostgreSQL tests, with no server to use: they pass, on one server
    (seen in the temporary directory while the run lasts), gone when the run ends."""
    env = {**os.environ, pg_server.ENV: pg_server.OWN, "TMPDIR": str(scratch)}
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
        "tests/test_store_reads.py", "-k", "postgres", cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    seen: set[str] = set()
    output = asyncio.ensure_future(run.communicate())
    while not output.done():
        seen |= {p.name for p in scratch.iterdir() if p.name.startswith("steward-pg-")}
        await asyncio.sleep(0.05)
    out = (await output)[0].decode(errors="replace")
    assert run.returncode == 0, out[-4000:]
    assert " passed" in out and "failed" not in out, out[-4000:]
    assert len(seen) == 1, seen
    assert not [p for p in scratch.iterdir() if p.name.startswith("steward-pg-")]
