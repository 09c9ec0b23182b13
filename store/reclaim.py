"""After a forget (store/forget.py): the space the forgotten words took, reclaimed, so
they are gone from the database's files and not only from its tables.

SQLite, in this order:

1. the full-text indexes merged (FTS5 `optimize`): a deleted row of an FTS5 index is a
   delete marker in a new segment, its words still in the old segments until a merge
   rewrites them; `optimize` merges every segment into one without them;
2. `VACUUM`: the database written anew, with no free page left holding old rows (it needs
   room for a copy of the database for a moment);
3. `PRAGMA wal_checkpoint(TRUNCATE)`: the `-wal` file (which holds every page written
   since the last checkpoint, the forgotten rows' old pages among them) copied into the
   database and cut to zero bytes. It waits for readers of older snapshots; a live reader
   that never lets go makes it report `wal_truncated = False`;
4. the vector index files (store/vector_index.py) removed: they hold the forgotten
   entries' vectors, and VACUUM may renumber the `entry_vectors` rows their names count
   by; the next search builds them again from the table.

PostgreSQL: `VACUUM (ANALYZE)` of the tables a forget touches: dead rows and their index
entries are cleaned and their space made reusable, and the planner's statistics (which
hold the most common words of the search index) are taken again. Plain VACUUM takes no
lock that stops the workers; it leaves the bytes of the dead rows in the table files
until PostgreSQL writes over them (VACUUM FULL would rewrite the tables, locking them
meanwhile: not done here).
"""

import asyncio
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from store import vector_index
from store.read.plain import run

log = logging.getLogger(__name__)

TABLES = ("entries", "entry_vectors", "conversations", "tasks", "submissions", "documents",
          "document_versions", "schedules", "usage", "inbound", "forgotten")
CHECKPOINT_TRIES = 40  # a quarter of a second apart: ten seconds for readers to let go


@dataclass(frozen=True)
class Reclaimed:
    backend: str
    before: int | None = None  # SQLite: bytes of the database and its -wal before
    after: int | None = None  # ... and after
    wal_truncated: bool = True
    vector_files: int = 0  # index files removed


async def reclaim(store) -> Reclaimed:
    """Reclaim the space, then mark every record in `forgotten` reclaimed."""
    if store.dialect == "postgresql":
        done = await _postgresql(store)
    else:
        done = await _sqlite(store)
    return done


async def _mark(store) -> None:
    await store._write(lambda conn: run(
        conn, "UPDATE forgotten SET reclaimed_at = :t WHERE reclaimed_at IS NULL",
        {"t": time.time()}))


async def _postgresql(store) -> Reclaimed:
    await _mark(store)
    pool = await store.engines.pool()
    async with pool.acquire() as conn:  # autocommitted: VACUUM runs outside a transaction
        await conn.execute(f"VACUUM (ANALYZE) {', '.join(TABLES)}")
    return Reclaimed("postgresql")


async def _sqlite(store) -> Reclaimed:
    async def optimize(conn):
        for table in ("entries_fts", "entries_cjk"):
            await run(conn, f"INSERT INTO {table} ({table}) VALUES ('optimize')")

    await store._write(optimize)
    async with store.reading() as conn:
        row = (await run(conn, "SELECT file FROM pragma_database_list WHERE name = 'main'")
               ).first()
    path = row[0] if row and row[0] else None
    if path is None:  # in memory: no file holds anything
        await _mark(store)
        return Reclaimed("sqlite")
    before = _size(path)
    await asyncio.to_thread(_vacuum, path)
    await _mark(store)  # a write to the -wal, cut again below
    truncated = await asyncio.to_thread(_checkpoint, path)
    removed = await asyncio.to_thread(vector_index.discard, Path(path + "-vectors"))
    return Reclaimed("sqlite", before, _size(path), truncated, removed)


def _size(path: str) -> int:
    total = 0
    for suffix in ("", "-wal"):
        try:
            total += Path(path + suffix).stat().st_size
        except FileNotFoundError:
            continue
    return total


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    db.execute("PRAGMA busy_timeout=60000")
    return db


def _vacuum(path: str) -> None:
    db = _connect(path)
    try:
        db.execute("VACUUM")
    finally:
        db.close()


def _checkpoint(path: str) -> bool:
    """Whether the -wal was copied back and cut to nothing."""
    db = _connect(path)
    try:
        for _ in range(CHECKPOINT_TRIES):
            busy, _log, _done = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return True
            time.sleep(0.25)
        log.warning("forget: %s-wal could not be cut: a reader held it all along", path)
        return False
    finally:
        db.close()
