"""A PostgreSQL server of the test's own (its own data directory and port, never the shared
server), for the fault tests: started, restarted (`-m fast` as a package upgrade does,
`-m immediate` as a crash does), stopped for a while, and removed. Run as the `postgres`
user when the tests run as root (the server refuses root). Every call waits for
`pg_ctl`; nothing blocks the event loop.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import socket
import tempfile
from pathlib import Path

import pytest


def _bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgCluster:
    """`root`: the directory of a cluster made before (by another process: the watchdog
    of tests/pg_server.py stops one it did not start); `connections`: max_connections."""

    def __init__(self, root: Path | None = None, port: int | None = None,
                 connections: int = 100):
        self.bin = _bindir()
        self.root = root or Path(tempfile.mkdtemp(prefix="steward-pg-"))
        self.data = self.root / "data"
        self.port = port or _free_port()
        self.connections = connections
        self.restarts = 0
        self._as: list[str] = []
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]

    @property
    def url(self) -> str:
        return f"postgresql+asyncpg://postgres@127.0.0.1:{self.port}/postgres"

    async def _pg(self, tool: str, *args: str, check: bool = True) -> str:
        proc = await asyncio.create_subprocess_exec(
            *self._as, str(self.bin / tool), *args, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        if check and proc.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)}: exit {proc.returncode}\n"
                               f"{out.decode(errors='replace')}\n{self.log_tail()}")
        return out.decode(errors="replace")

    async def start(self) -> None:
        if not self.data.exists():
            await self._pg("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                           "--no-sync", "-E", "UTF8")
        await self._pg("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data),
                       "-l", str(self.root / "server.log"), "-o",
                       f"-p {self.port} -c listen_addresses=127.0.0.1 "
                       f"-k {self.root} -c fsync=off -c full_page_writes=off "
                       f"-c max_connections={self.connections}")

    async def stop(self, mode: str = "fast") -> None:
        await self._pg("pg_ctl", "stop", "-w", "-t", "60", "-m", mode, "-D", str(self.data))

    async def restart(self, mode: str = "fast", down: float = 0.0) -> None:
        """Stop (`fast`: sessions ended, as an upgrade does; `immediate`: as a crash), stay
        down `down` seconds, start again."""
        await self.stop(mode)
        if down:
            await asyncio.sleep(down)
        await self.start()
        self.restarts += 1

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.root / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def pid(self) -> int | None:
        """The postmaster's pid (the first line of its pid file), None when it is down."""
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    async def remove(self) -> None:
        if (self.data / "postmaster.pid").exists():
            await self._pg("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.data),
                           check=False)
        await asyncio.to_thread(shutil.rmtree, self.root, True)


@pytest.fixture(name="pg")
async def pg_fixture():
    """A server of the test's own, started; removed after the test."""
    cluster = PgCluster()
    try:
        await cluster.start()
        yield cluster
    finally:
        await cluster.remove()

