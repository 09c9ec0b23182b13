"""One leader among the workers on a store, for the loops that must run once: watching a
mailbox, firing schedules.

On PostgreSQL the leader holds a session advisory lock named after the job on a connection
of its own; the server drops it the moment that connection dies, however the process died,
and another worker, trying every `poll_seconds`, takes it over. The holder checks its
connection as often: if it is gone (the server restarted, the network broke), `lost` is set
and the job must stop, since another may already lead. On SQLite there is one node (the
runner lock in the home directory keeps a second process off the store): always the leader.

    async with store.leader("email:steward@example.com") as leader:
        while await leader.acquire(stop):
            ... run until stop or leader.lost ...
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy import text

from store.liveness import lock_key

log = logging.getLogger(__name__)


class Leader:
    def __init__(self, engine, name: str, *, poll_seconds: float = 2.0):
        self.engine, self.name, self.poll_seconds = engine, name, poll_seconds
        self.key = lock_key("leader:" + name)  # the advisory lock's key
        self.lost = asyncio.Event()
        self._conn = None
        self._watch: asyncio.Task | None = None

    async def __aenter__(self) -> Leader:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.release()

    @property
    def leading(self) -> bool:
        return (self.engine is None or self._conn is not None) and not self.lost.is_set()

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this worker leads (True) or `stop` is set (False)."""
        await self.release()  # after a loss: start from a fresh connection
        self.lost.clear()
        if self.engine is None:
            return not stop.is_set()
        failing = False
        while not stop.is_set():
            try:
                if await self._try():
                    log.info("leading %s", self.name)
                    self._watch = asyncio.create_task(self._check())
                    return True
            except Exception as exc:  # the database is away: try again later
                if not failing:  # once an outage, not every poll
                    log.warning("cannot ask to lead %s: %s", self.name, exc)
                failing = True
                await self.release()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_seconds)
        return False

    async def _try(self) -> bool:
        if self._conn is None:
            self._conn = await self.engine.connect()
        got = (await self._conn.execute(text("SELECT pg_try_advisory_lock(:k)"),
                                        {"k": self.key})).scalar()
        await self._conn.commit()
        return bool(got)

    async def _check(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            try:
                await asyncio.wait_for(self._conn.execute(text("SELECT 1")), self.poll_seconds)
                await self._conn.commit()
            except Exception as exc:
                log.warning("lost the lead of %s: %s", self.name, exc)
                self.lost.set()
                return

    async def release(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watch
            self._watch = None
        conn, self._conn = self._conn, None
        if conn is not None:
            # Closed for real, not back to the pool: the lock goes with the session. A
            # connection that broke has a transaction to roll back first.
            for step in (conn.rollback, conn.invalidate, conn.close):
                with contextlib.suppress(Exception):
                    await step()
