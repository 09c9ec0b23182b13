"""The store opened only to read, as cheaply as it can be.

An SQLite file already at this build's schema is read through the standard library
(`store.read.plain`): `steward sessions`, `log`, `search`, `tasks`, `schedules`, `quarantine`
and `usage` then start without SQLAlchemy.
Anything else (PostgreSQL, a database behind or not there yet) opens the full `Store`,
which migrates first as every start does. Both answer the same reads, from the same SQL
(store/read/queries.py, store/search.py through `reading()`).
"""

import asyncio
import sqlite3
from contextlib import asynccontextmanager
from pathlib import Path

from store.read import queries as _reads
from store.read.plain import PlainConnection
from store.records import Conversation, Entry, Schedule, Task
from store.revision import HEAD

_SQLITE_SCHEMES = ("sqlite:///", "sqlite+aiosqlite:///")


class Reader:
    """The reads of `Store` that the reading commands use, over a read-only connection."""

    dialect = "sqlite"

    def __init__(self, conn: PlainConnection):
        self._conn = conn

    @asynccontextmanager
    async def reading(self):
        yield self._conn

    async def get_conversation(self, key: str) -> Conversation:
        return await _reads.conversation(self._conn, key)

    async def list_conversations(self, *, limit: int = 50,
                                 before_id: int | None = None) -> list[Conversation]:
        return await _reads.conversations_page(self._conn, limit, before_id)

    async def entries_page(self, conversation_id: int, *, before: int | None = None,
                           after: int | None = None, limit: int = 50) -> list[Entry]:
        return await _reads.entries_page(self._conn, conversation_id, before=before,
                                         after=after, limit=limit)

    async def get_conversation_by_id(self, conversation_id: int) -> Conversation:
        return await _reads.conversation_by_id(self._conn, conversation_id)

    async def list_tasks(self, *, state: str | None = None, limit: int = 100) -> list[Task]:
        return await _reads.tasks_page(self._conn, limit=limit, state=state)

    async def list_schedules(self, *, state: str | None = None,
                             limit: int = 100) -> list[Schedule]:
        return await _reads.schedules_page(self._conn, state=state, conversation_id=None,
                                           limit=limit)

    async def list_submissions(self, *, state: str | None = None, channel: str | None = None,
                               limit: int = 100) -> list[dict]:
        return await _reads.submissions_page(self._conn, state=state, channel=channel,
                                             limit=limit)

    async def spend_report(self, since: float, *, day_offset: float = 0.0) -> list[dict]:
        return await _reads.spend_report(self._conn, since, day_offset, self.dialect)

    async def close(self) -> None:
        await self._conn.close()


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite URL (`sqlite+aiosqlite:///relative`, `...:////absolute`), or
    None for anything else (another database, memory, URL options)."""
    for scheme in _SQLITE_SCHEMES:
        if url.startswith(scheme):
            rest = url[len(scheme):]
            if not rest or rest.startswith(":memory:") or "?" in rest:
                return None
            return Path(rest)
    return None


def _at_head(path: Path) -> bool:
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:  # not a Steward database, or never migrated
        return False
    finally:
        db.close()
    return row is not None and row[0] == HEAD


async def open_reader(url: str) -> Reader | None:
    """A `Reader` for `url` if it is an SQLite file at this build's schema, else None."""
    path = sqlite_path(url)
    if path is None or not await asyncio.to_thread(path.is_file):
        return None
    if not await asyncio.to_thread(_at_head, path):
        return None
    try:
        conn = await asyncio.to_thread(PlainConnection, str(path))
    except sqlite3.Error:
        return None
    return Reader(conn)


async def open_for_reading(url: str, **options):
    """A `Reader` where one will do, else the migrated `Store` (the same reads; `options`
    are `open_store`'s); a database without Steward's tables is refused (`NoSchema`)."""
    reader = await open_reader(url)
    if reader is not None:
        return reader
    from store import open_store

    return await open_store(url, create=False, **options)
