"""The PostgreSQL server the tests use, found or started once per run.

In order:
1. `STEWARD_TEST_PG_URL`, when it names a server (`own` means: always start one, below);
2. the local server at 127.0.0.1:5432 with trust auth and a database `test`, when it
   answers (the fast path: nothing to start);
3. else a throwaway server of the run's own: initdb in a temporary directory, a free port,
   its unix socket in that directory, a database `test` with the `vector` extension where
   pgvector is installed (scripts/install-test-deps installs it), built on the same
   `PgCluster` the fault tests restart (tests/fakes/pg_cluster.py).

tests/conftest.py resolves it in `pytest_configure` and exports the URL in
`STEWARD_TEST_PG_URL`: pytest-xdist starts its workers after that hook, from the same
environment, so one server serves every worker, and a plain `pytest` works the same way.
The process that started the server stops it (by the pid in its pid file) when the run
ends; a watchdog of its own, in a session of its own, stops it too if that process dies
first (SIGKILL, a closed terminal), so no run leaves a server behind.
"""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
from pathlib import Path

import asyncpg

from tests.fakes.pg_cluster import PgCluster

ENV = "STEWARD_TEST_PG_URL"
LOCAL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
OWN = "own"
PROBE_SECONDS = 10.0
REPO = Path(__file__).resolve().parent.parent


def plain(url: str) -> str:
    """The URL as asyncpg and libpq take it (no SQLAlchemy driver name)."""
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def answers(url: str) -> bool:
    """Whether `url` takes a connection as it is (no password asked, the database there)."""
    try:
        conn = await asyncpg.connect(plain(url), timeout=PROBE_SECONDS)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    await conn.close()
    return True


class Throwaway:
    """A server of this run's own with a database `test`, watched while it runs."""

    def __init__(self, connections: int = 200):
        self.cluster = PgCluster(connections=connections)
        self.watchdog: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.cluster.port}/test"

    async def start(self) -> str:
        try:
            await self.cluster.start()
            # A plain Popen (in a thread): `stop` may run under another event loop.
            self.watchdog = await asyncio.to_thread(
                subprocess.Popen,
                [sys.executable, "-m", "tests.pg_server", "watch", str(os.getpid()),
                 str(self.cluster.root)], cwd=REPO, start_new_session=True,
                stdin=subprocess.DEVNULL)
            await self._make_test_database()
        except BaseException:
            await self.stop()
            raise
        return self.url

    async def _make_test_database(self) -> None:
        admin = await asyncpg.connect(plain(self.cluster.url))
        try:
            await admin.execute("CREATE DATABASE test")
        finally:
            await admin.close()
        conn = await asyncpg.connect(plain(self.url))
        try:
            # Made once here, not by each test's migration at once (concurrent CREATE
            # EXTENSION collide); in `public`, as migration 0013 would.
            if await conn.fetchval("SELECT count(*) FROM pg_available_extensions "
                                   "WHERE name = 'vector'"):
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        finally:
            await conn.close()

    async def stop(self) -> None:
        await self.cluster.remove()
        if self.watchdog is not None:
            self.watchdog.terminate()
            await asyncio.to_thread(self.watchdog.wait)
            self.watchdog = None


async def resolve(env: dict | None = None, local: str = LOCAL
                  ) -> tuple[str, Throwaway | None]:
    """The URL of the server for this run, and the throwaway server when one was started
    (for the caller to stop)."""
    named = (os.environ if env is None else env).get(ENV, "")
    if named and named != OWN:
        return named, None
    if not named and await answers(local):
        return local, None
    try:
        server = Throwaway()
    except RuntimeError as exc:  # no server programs on this machine
        raise RuntimeError(f"no PostgreSQL server for the tests: {exc}; install it "
                           f"(bash scripts/install-test-deps) or name one in {ENV}") from None
    return await server.start(), server


def watch(owner: int, root: Path) -> None:
    """Wait for `owner` to end, then stop and remove the cluster in `root` (if the owner
    did not: a run killed before its cleanup)."""
    try:
        fd = os.pidfd_open(owner)
    except ProcessLookupError:
        pass
    else:
        select.select([fd], [], [])
    if root.exists():
        asyncio.run(PgCluster(root=root, port=1).remove())


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch"]:
        watch(int(sys.argv[2]), Path(sys.argv[3]))
