"""PostgreSQL behind `store.backend.Backend`: several workers on one database. A step of
the common shape is one call of the server-side `steward_step` (generated from the same
plan SQLite runs: store/postgres/step_function.py); a lone task update, and one with the
claim that takes its slot, are single prepared statements (store/hotpath.py); anything else
is a SQLAlchemy transaction (store/commit.py) whose inserts are the plan's own. Liveness
and leadership are advisory locks."""

import contextlib
import logging
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from store import commit as _commit
from store import hotpath as _hot
from store import liveness as _liveness
from store import steps as _steps
from store import tasks as _tasks
from store.engine import Engines
from store.leader import Leader
from store.outage import is_unavailable
from store.parents import Parents
from store.postgres import step_function
from store.records import CommitResult, Task, now
from store.writes import Claim, Writes

log = logging.getLogger(__name__)

# One index probe per id: a plain `IN (...)` is planned from statistics, and on a
# never-analyzed table (a fresh import, autovacuum off) it filters the whole channel.
_KNOWN = text(
    "SELECT x.id FROM unnest(CAST(:ids AS text[])) AS x(id) CROSS JOIN LATERAL "
    "(SELECT 1 FROM submissions s WHERE s.channel = :channel AND s.external_id = x.id "
    "LIMIT 1) AS hit")


class PostgresBackend:
    dialect = "postgresql"
    single_node = False

    def __init__(self, engines: Engines):
        self.engines = engines
        self._liveness: dict = {}  # runner owner -> the connection holding its liveness lock

    async def opening(self) -> None:
        return None

    def snapshot_dir(self) -> Path | None:
        return None  # Steward's callers always name one

    async def commit(self, writes: Writes, then_claim: Claim | None,
                     parents: Parents) -> CommitResult:
        """Three ways in, one set of statements. A lone task update (most phases of most
        tasks), with the claim that takes its slot or without, is `hotpath.UPDATE_SQL`
        alone or inside `UPDATE_THEN_CLAIM_PG`: the very text `steward_step` runs for its
        update, one prepared statement and one round trip, where a call of the function
        runs PL/pgSQL over sixty-odd arguments. A step of the common shape is
        one call of `steward_step`. Anything else (documents, schedules, withdrawals) is
        `commit.apply` in a SQLAlchemy transaction, whose submissions, entries, tasks and
        usage are `steps.inserts`, the statements the function is rendered from
        (store/step_sql.py): a column is added in one place whichever way a step goes."""
        update = _hot.lone_update(writes)
        if update is not None and _hot.pg_fits(update, parents.get(update.task_id) is None):
            async with (await self.engines.pool()).acquire() as conn:
                if then_claim is None:
                    await _hot.pg_update(conn, update, now())
                    return CommitResult()
                return CommitResult(claimed=await _hot.pg_update_then_claim(
                    conn, update, then_claim, now()))
        if _steps.fits(writes):
            parent = parents.get(writes.task_update and writes.task_update.task_id)
            blocked: list[tuple[str, str]] = []
            async with (await self.engines.pool()).acquire() as conn:
                result = await step_function.on_postgres(
                    conn, writes, now(), parent, then_claim,
                    lambda task_id, reason: blocked.append((task_id, reason)))
                for task_id, reason in blocked:
                    await conn.execute(_hot.BLOCK_ASYNCPG, task_id, reason, now())
            return result
        result = await self.write(lambda conn: _commit.apply(conn, self.dialect, writes))
        if then_claim is not None:
            result.claimed = await self.claim(then_claim)
        return result

    async def claim(self, c: Claim) -> list[Task]:
        async with (await self.engines.pool()).acquire() as conn:
            return await _hot.pg_claim(conn, c, now())

    async def write(self, fn):
        async with self.engines.write.begin() as conn:
            return await fn(conn)

    async def read(self, fn):
        """On a lookup connection, autocommitted; a pooled connection the server dropped
        (a restart, a broken network), and with it the pool's others, is read on again."""
        engine = self.engines.lookups or self.engines.read
        try:
            async with engine.connect() as conn:
                return await fn(conn)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
            log.info("store: a read's connection was gone; reading again")
        async with engine.connect() as conn:
            return await fn(conn)

    async def lookup(self, fn):
        """On a hot-path asyncpg connection, one round trip a statement; a read whose
        connection the server dropped is sent again once, on a new one."""
        import asyncpg

        from store.read.asyncpg_text import AsyncpgText

        pool = await self.engines.pool()
        try:
            async with pool.acquire() as conn:
                return await fn(AsyncpgText(conn))
        except (OSError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                asyncpg.PostgresConnectionError, asyncpg.AdminShutdownError):
            # Gone (a restart, a broken network, a terminated backend), and left by the
            # pool (HotPool keeps a connection only after a statement the server refused).
            log.info("store: a lookup's connection was gone; reading again")
        async with pool.acquire() as conn:
            return await fn(AsyncpgText(conn))

    def known_statement(self, channel: str, ids: list[str]):
        return _KNOWN, {"ids": ids, "channel": channel}

    def leader(self, name: str, poll_seconds: float) -> Leader:
        # Advisory locks are per database, stores per schema: the schema is in the name.
        where = self.engines.pg_settings.get("search_path", "public")
        return Leader(self.engines.write, f"{where}/{name}", poll_seconds=poll_seconds)

    async def dead_owners(self) -> list[str]:
        """Owners of running tasks whose liveness lock is free."""
        async with self.engines.write.connect() as conn:
            dead = await _liveness.dead(conn, await _tasks.running_owners(conn))
            await conn.commit()
        return dead

    async def announce_worker(self, owner: str) -> bool:
        held = self._liveness.get(owner)
        if held is not None:
            try:
                await held.execute(text("SELECT 1"))
                await held.commit()
                return False
            except DBAPIError as exc:
                if not is_unavailable(exc):
                    raise
                log.warning("store: this worker's liveness lock went with its connection "
                            "(%s); taking it again", type(exc).__name__)
                del self._liveness[owner]
                with contextlib.suppress(Exception):
                    await held.close()
        self._liveness[owner] = await _liveness.hold(self.engines.write, owner)
        return held is not None

    async def close(self) -> None:
        for conn in self._liveness.values():
            await conn.close()
        self._liveness.clear()
        await self.engines.dispose()

