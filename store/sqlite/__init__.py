"""SQLite behind `store.backend.Backend`: one file, every write transaction on one writer
thread (store/writer.py, grouped commits), reads on reader threads (read pool), no round
trips: a step's plan (store/steps.py) runs statement by statement on the writer's own
connection, and the claim that takes its slot shares its transaction (one fsync)."""

import asyncio
import logging
from pathlib import Path

from sqlalchemy import select

from store import commit as _commit
from store import hotpath as _hot
from store import steps as _steps
from store import wal_guard
from store.engine import Engines
from store.leader import Leader
from store.parents import Parents
from store.records import CommitResult, Task, now
from store.schema import submissions
from store.writes import Claim, Writes

log = logging.getLogger(__name__)


class SqliteBackend:
    dialect = "sqlite"
    single_node = True

    def __init__(self, engines: Engines):
        self.engines = engines
        self._writer = engines.writer
        self._readers = engines.readers

    async def opening(self) -> None:
        if self.engines.sqlite_file is not None:
            await asyncio.to_thread(wal_guard.verify, self.engines.sqlite_file)

    def snapshot_dir(self) -> Path | None:
        f = self.engines.sqlite_file
        return None if f is None else f.parent / "snapshots"

    async def commit(self, writes: Writes, then_claim: Claim | None,
                     parents: Parents) -> CommitResult:
        parent = parents.get(writes.task_update and writes.task_update.task_id)
        common = _steps.fits(writes)

        def job(s):
            t = now()
            if common:
                result = _steps.on_sqlite(s.raw, _steps.plan(writes, t, parent))
            else:
                result = s.inline(lambda conn: _commit.apply(conn, self.dialect, writes))
            if then_claim is not None:  # its own clock: what the step spawned is due
                result.claimed = _hot.sqlite_claim(s.raw, then_claim, now())
            return result

        return await self._writer.run(job)

    async def claim(self, c: Claim) -> list[Task]:
        return await self._writer.run(lambda s: _hot.sqlite_claim(s.raw, c, now()))

    async def write(self, fn):
        return await self._writer.run(lambda s: s.inline(fn))

    async def read(self, fn):
        """One hop to a reader thread, where `fn` runs whole (it awaits only
        `conn.execute`); an in-memory database reads through its read engine."""
        if self._readers is not None:
            return await self._readers.run(fn)
        async with self.engines.read.connect() as conn:
            return await fn(conn)

    async def lookup(self, fn):
        if self._readers is not None:
            return await self._readers.run(fn, text=True)
        return await self.read(fn)

    def known_statement(self, channel: str, ids: list[str]):
        return select(submissions.c.external_id).where(
            submissions.c.channel == channel, submissions.c.external_id.in_(ids)), None

    def leader(self, name: str, poll_seconds: float) -> Leader:
        return Leader(None, f"public/{name}", poll_seconds=poll_seconds)  # always the leader

    async def dead_owners(self) -> list[str]:
        return []  # one node: its runner lock keeps a second process off the store

    async def announce_worker(self, owner: str) -> bool:
        return False

    async def close(self) -> None:
        await self.engines.dispose()
