"""Engines for the two supported databases, and migrations applied on open.

SQLite: one file, WAL, `synchronous=FULL` (a committed step survives a power cut, not only
a crash), foreign keys on, a busy timeout. Writes go through a single connection that
begins with `BEGIN IMMEDIATE`, so a read-then-write step never deadlocks on lock upgrade;
reads use their own small pool and never wait for a writer (WAL).

PostgreSQL (asyncpg): one engine for both. A `schema` query parameter on the URL (our
extension) selects a search_path, which the tests use for isolation.
"""

from dataclasses import dataclass
from pathlib import Path

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import event, make_url, text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from store.errors import StoreError

MIGRATIONS = Path(__file__).parent / "migrations"
# Any constant works; it only has to be the same in every Steward process.
_MIGRATION_LOCK = 0x5354_4557


@dataclass
class Engines:
    write: AsyncEngine
    read: AsyncEngine
    dialect: str

    async def dispose(self) -> None:
        await self.write.dispose()
        if self.read is not self.write:
            await self.read.dispose()


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
        cur = dbapi_conn.cursor()
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON",
                       "busy_timeout=30000"):
            cur.execute(f"PRAGMA {pragma}")
        cur.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def create_engines(url_text: str) -> Engines:
    url = make_url(url_text)
    backend = url.get_backend_name()
    if backend == "sqlite":
        if url.database and url.database != ":memory:":
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        write = _sqlite_engine(url, immediate=True, pool_size=1)
        read = _sqlite_engine(url, immediate=False, pool_size=4)
        return Engines(write=write, read=read, dialect="sqlite")
    if backend == "postgresql":
        connect_args = {}
        schema = url.query.get("schema")
        if schema:
            url = url.difference_update_query(["schema"])
            connect_args["server_settings"] = {"search_path": schema}
        engine = create_async_engine(url, pool_size=10, max_overflow=10,
                                     connect_args=connect_args, pool_pre_ping=True)
        return Engines(write=engine, read=engine, dialect="postgresql")
    raise StoreError(f"unsupported store url {url_text!r}: use sqlite+aiosqlite or "
                     "postgresql+asyncpg")


def _upgrade(sync_conn, revision: str) -> None:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = sync_conn
    command.upgrade(cfg, revision)


async def migrate(engines: Engines, revision: str = "head") -> None:
    """Apply pending migrations in one transaction (several processes may race here)."""
    async with engines.write.begin() as conn:
        if engines.dialect == "postgresql":
            await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
        await conn.run_sync(_upgrade, revision)


async def current_revision(engines: Engines) -> str | None:
    async with engines.read.connect() as conn:
        try:
            row = (await conn.execute(text("SELECT version_num FROM alembic_version"))).first()
        except Exception:  # no table yet: a database never opened by Steward
            return None
        return row[0] if row else None
