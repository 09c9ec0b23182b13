"""Engines for the two supported databases, and migrations applied on open.

SQLite: one file, WAL, `synchronous=FULL` (a committed step survives a power cut, not only
a crash), foreign keys on, a busy timeout. Writes go through a single connection that
begins with `BEGIN IMMEDIATE`, so a read-then-write step never deadlocks on lock upgrade;
reads use their own small pool and never wait for a writer (WAL).

The SQLite files are private to their owner: a directory created for the database is 0700,
the database is created 0600 before SQLite opens it (SQLite gives its `-wal`, `-shm` and
`-journal` files the database's own mode), and existing ones left readable by others are
tightened to 0600 on open.

The store's own write transactions on SQLite run on one thread that owns a connection of
its own (`store/writer.py`, with group commit); the write engine here serves migrations and
the few writers outside the store. Its reads run on reader threads of their own
(`store/read/pool.py`), one hop each; the read engine serves the rest.

PostgreSQL (asyncpg): an engine for reads (each connection pinged before use), one for the
store's own lookups (autocommitted, never pinged), and one for writes (never pinged: a dead
connection fails its transaction, which is retried like any failed commit), plus a pool of
bare asyncpg connections for the task queue's fixed statements (`store/hotpath.py`,
`HotPool`). A `schema` query parameter on the URL (our
extension) selects a search_path, which the tests use for isolation.
"""

import asyncio
import contextlib
import logging
import os
import sqlite3
import stat
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import event, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from store import revision
from store.errors import NewerSchema, SnapshotFailed, StoreError
from store.outage import is_unavailable
from store.read.pool import SqliteReaders
from store.wal_guard import Marks
from store.writer import SqliteWriter

MIGRATIONS = Path(__file__).parent / "migrations"
# Any constant works; it only has to be the same in every Steward process.
_MIGRATION_LOCK = 0x5354_4557
_SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")
_SQLITE_PRAGMAS = ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON",
                   "busy_timeout=30000")

log = logging.getLogger(__name__)


@dataclass
class Engines:
    write: AsyncEngine
    read: AsyncEngine
    dialect: str
    writer: SqliteWriter | None = None  # SQLite: the store's own write transactions
    sqlite_file: Path | None = None  # SQLite: the database's file (None: in memory)
    readers: SqliteReaders | None = None  # SQLite (a file): the store's own reads
    lookups: AsyncEngine | None = None  # PostgreSQL: the store's own reads (see below)
    pg_dsn: str | None = None  # PostgreSQL: for the hot path's pool
    pg_settings: dict = field(default_factory=dict)
    _pool: "HotPool | None" = None

    async def pool(self) -> "HotPool":
        """The connections for `store/hotpath.py`, each opened on first use."""
        if self._pool is None:
            self._pool = HotPool(self.pg_dsn, self.pg_settings, max_size=10)
        return self._pool

    async def dispose(self) -> None:
        if self.writer is not None:
            await self.writer.close()
        if self.readers is not None:
            await self.readers.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        await self.write.dispose()
        if self.read is not self.write:
            await self.read.dispose()
        if self.lookups is not None:
            await self.lookups.dispose()


class HotPool:
    """Up to `max_size` asyncpg connections for the hot path: `async with pool.acquire() as
    conn` (or `conn = await pool.acquire()` ... `await pool.release(conn)`).

    Every use is autocommitted statements that leave no session state behind, so a
    connection goes back as it is: no reset round trip, and none of asyncpg's pool
    machinery (a shielded release task per use, a good part of a step's client time). A
    use that ended other than normally or by the server refusing a statement (cancelled
    mid-statement, a broken socket) closes its connection instead of handing it on."""

    def __init__(self, dsn: str, settings: dict, *, max_size: int):
        import asyncpg

        self._connect = asyncpg.connect
        self._kept_after = (asyncpg.PostgresError, StoreError)  # the connection is fine
        self._dsn = dsn
        # One plan per statement, made at its first use. Left to choose, PostgreSQL plans
        # the claim afresh at every execution once the table has statistics (planning then
        # costs more than running it); the generic plan reads the same indexes.
        self._settings = {**settings, "plan_cache_mode": "force_generic_plan"}
        self._idle: list = []
        self._slots = asyncio.Semaphore(max_size)
        self._closed = False

    def acquire(self) -> "_HotLease":
        return _HotLease(self)

    async def _take(self):
        await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.is_closed():
                    return conn
            return await self._connect(self._dsn, server_settings=self._settings)
        except BaseException:
            self._slots.release()
            raise

    def _give_back(self, conn, healthy: bool) -> None:
        self._slots.release()
        if healthy and not self._closed and not conn.is_closed():
            self._idle.append(conn)
        elif not conn.is_closed():
            conn.terminate()

    async def release(self, conn) -> None:
        self._give_back(conn, True)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            with contextlib.suppress(Exception):
                await conn.close(timeout=5)


class _HotLease:
    __slots__ = ("_pool", "_conn")

    def __init__(self, pool: HotPool):
        self._pool = pool
        self._conn = None

    def __await__(self):
        return self._pool._take().__await__()

    async def __aenter__(self):
        self._conn = await self._pool._take()
        return self._conn

    async def __aexit__(self, _type, exc, _tb) -> None:
        pool = self._pool
        # A refusal leaves the connection fine; the server shutting down, crashing or
        # dropping it does not, even when it said so as an error (57P01 `AdminShutdown`):
        # kept, its next use would find it half-way through the last one.
        pool._give_back(self._conn, exc is None or (isinstance(exc, pool._kept_after)
                                                    and not is_unavailable(exc)))


def _configure_sqlite(dbapi_conn) -> None:
    cur = dbapi_conn.cursor()
    for pragma in _SQLITE_PRAGMAS:
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


def _writer_connection(path: str) -> sqlite3.Connection:
    """The writer thread's connection: transactions are spelled out by the writer."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    _configure_sqlite(conn)
    return conn


def _reader_connection(path: str) -> sqlite3.Connection:
    """A reader thread's connection (store/read/pool.py), which may never write."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout=30000")
    conn.execute("PRAGMA query_only=ON")
    return conn


def _sqlite_engine(url: URL, *, immediate: bool, pool_size: int) -> AsyncEngine:
    engine = create_async_engine(
        url,
        poolclass=AsyncAdaptedQueuePool,
        pool_size=pool_size,
        max_overflow=0,
        connect_args={"timeout": 30},
    )

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy's BEGIN below be the only transaction control.
        dbapi_conn.isolation_level = None
        _configure_sqlite(dbapi_conn)

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _private_database_files(db: Path) -> None:
    """The database's directory (0700 when made here) and the database, created 0600 if
    missing; the database and its companion files tightened to 0600 if others may read
    them. Runs once per open, before the first connection."""
    db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:  # an empty file is an empty database to SQLite
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    for path in (db, *(db.with_name(db.name + suffix) for suffix in _SQLITE_COMPANIONS)):
        try:
            mode = path.stat().st_mode
            if mode & 0o077:
                os.chmod(path, stat.S_IMODE(mode) & ~0o077)
        except FileNotFoundError:
            continue
        except PermissionError as exc:  # a database shared on purpose, owned by another user
            log.warning("cannot make %s private: %s", path, exc)


def create_engines(url_text: str) -> Engines:
    url = make_url(url_text)
    backend = url.get_backend_name()
    if backend == "sqlite":
        database = url.database or ""
        if database and database != ":memory:":
            _private_database_files(Path(database))
        write = _sqlite_engine(url, immediate=True, pool_size=1)
        read = _sqlite_engine(url, immediate=False, pool_size=4)
        readers = marks = None
        if database and database != ":memory:":  # one database only when it is a file
            readers = SqliteReaders(lambda: _reader_connection(database))
            marks = Marks(Path(database))
        writer = SqliteWriter(lambda: _writer_connection(database or ":memory:"), marks=marks)
        return Engines(write=write, read=read, dialect="sqlite", writer=writer,
                       readers=readers, sqlite_file=Path(database) if marks else None)
    if backend == "postgresql":
        connect_args = {}
        schema = url.query.get("schema")
        if schema:
            url = url.difference_update_query(["schema"])
            connect_args["server_settings"] = {"search_path": schema}
        write = create_async_engine(url, pool_size=10, max_overflow=10,
                                    connect_args=connect_args)
        read = create_async_engine(url, pool_size=5, max_overflow=10,
                                   connect_args=connect_args, pool_pre_ping=True)
        # The store's lookups: each statement its own transaction (under read committed a
        # statement sees its own snapshot anyway), no ping before use (`Store._read` tries
        # again once on a connection found dead): one round trip where the read engine's
        # ping, BEGIN and ROLLBACK made four. Searches keep the read engine: they set
        # planner options for their transaction.
        lookups = create_async_engine(url, pool_size=5, max_overflow=10,
                                      connect_args=connect_args, isolation_level="AUTOCOMMIT")
        dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        return Engines(write=write, read=read, dialect="postgresql", pg_dsn=dsn,
                       pg_settings=connect_args.get("server_settings", {}), lookups=lookups)
    raise StoreError(f"unsupported store url {url_text!r}: use sqlite+aiosqlite or "
                     "postgresql+asyncpg")


def _upgrade(sync_conn, revision: str) -> None:
    # Alembic only when there is something to migrate (store/revision.py says when).
    from alembic import command
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = sync_conn
    command.upgrade(cfg, revision)


def _scripts():
    from alembic.config import Config as AlembicConfig
    from alembic.script import ScriptDirectory

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg)


def _target(revision: str) -> str:
    return _scripts().get_revision(revision).revision


@dataclass(frozen=True)
class Upgrade:
    """What `migrate` found and did: the revision before (None: a database with no schema
    yet), the one after, and the snapshot taken before migrating (None: nothing to keep,
    none asked for, or nothing to migrate)."""

    before: str | None
    after: str
    snapshot: Path | None = None

    @property
    def migrated(self) -> bool:
        return self.before != self.after


async def migrate(engines: Engines, revision: str = "head", *,
                  snapshot_dir: Path | None = None) -> Upgrade:
    """Apply pending migrations in one transaction (several processes may race here).

    With `snapshot_dir`, a database that has a schema already is copied there first
    (store/snapshot.py), under the migration lock, and is not migrated if that fails
    (`SnapshotFailed`). A database at a revision this build does not know was migrated by
    a newer Steward: refused (`NewerSchema`), never downgraded.

    A revision that commits as it goes (0008) lets another process in between its steps;
    the one beaten to the end fails, rolls back, and finds the database where it wanted it.
    """
    before = await current_revision(engines)
    scripts = _scripts()
    target = scripts.get_revision(revision).revision
    if before is not None and before not in {s.revision for s in scripts.walk_revisions()}:
        raise NewerSchema(_newer(engines, before, scripts.get_current_head()))
    if before == target:
        return Upgrade(before, target)
    snapshot = None
    try:
        async with engines.write.begin() as conn:
            if engines.dialect == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"),
                                   {"k": _MIGRATION_LOCK})
            if before is not None and snapshot_dir is not None:
                # Under the lock: another process may have migrated it meanwhile.
                now = (await conn.execute(text("SELECT version_num FROM alembic_version"))
                       ).scalar()
                if now != target:
                    snapshot = await _snapshot(engines, snapshot_dir, now, target)
            await conn.run_sync(_upgrade, revision)
    except SnapshotFailed:
        raise
    except Exception:
        if await current_revision(engines) != target:
            raise
        log.info("another process finished the migration to %s meanwhile", revision)
    return Upgrade(before, target, snapshot)


async def _snapshot(engines: Engines, directory: Path, before: str, after: str) -> Path | None:
    from store import snapshot

    if engines.dialect == "sqlite":
        if engines.sqlite_file is None:  # in memory: nothing outlives the process anyway
            return None
        path = await asyncio.to_thread(snapshot.take_sqlite, engines.sqlite_file, directory,
                                       before, after)
    else:
        path = await asyncio.to_thread(snapshot.take_postgres, engines.pg_dsn,
                                       engines.pg_settings.get("search_path"), directory,
                                       before, after)
    log.warning("migrating the database from %s to %s; a snapshot of it as it was is in %s",
                before, after, path)
    return path


def _newer(engines: Engines, found: str, head: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        build = f"steward {version('steward')}"
    except PackageNotFoundError:
        build = "this build"
    where = (str(engines.sqlite_file) if engines.sqlite_file is not None
             else "in memory" if engines.dialect == "sqlite"
             else make_url(engines.pg_dsn).render_as_string(hide_password=True))
    return (f"the database ({where}) was written by a newer Steward: its schema is at "
            f"revision {found}, and {build} knows revisions up to {head}; upgrade Steward "
            "to the version that wrote it (or restore the snapshot taken before that "
            "upgrade); nothing was changed")


async def current_revision(engines: Engines) -> str | None:
    return await revision.current(engines)


def described(url: str) -> str:
    """A database as a person names it: "PostgreSQL database 'x' (schema y)", or the file."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return f"the SQLite database {parsed.database}"
    schema = parsed.query.get("schema")
    return f"PostgreSQL database {parsed.database!r}" + (f" (schema {schema})" if schema else "")
