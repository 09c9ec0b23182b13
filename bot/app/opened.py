"""The store of this Steward, opened for a command or a whole process: the home made
private first (0700, its files 0600, as DESIGN.md says), closed when done. Light on
purpose: the reading commands import it without the agent."""

import asyncio
import sys
from contextlib import asynccontextmanager

from bot.home import make_private


@asynccontextmanager
async def _opened(config, open_fn, **options):
    await asyncio.to_thread(make_private, config.home)
    store = await open_fn(config.store_url, snapshot_dir=snapshot_dir(config), **options)
    try:
        yield store
    finally:
        await store.close()


def snapshot_dir(config):
    """Where the database is copied before a migration (store/snapshot.py)."""
    return config.home / "snapshots"


def opened_store(config, **options):
    """A database at this build's schema opens without Alembic (store.revision); one
    behind is migrated first, as every start does, after a snapshot of it in the home's
    `snapshots/` (`options`: `open_store`'s, e.g. `snapshot=False`)."""
    from store import open_store

    return _opened(config, open_store, **options)


def opened_reader(config, *, listing: bool = True):
    """The store for a command that only reads: through the standard library when the
    database is SQLite at this build's schema (store/read/reader.py), else the store,
    migrated if behind. Where there is no database yet (no SQLite file, or a PostgreSQL
    database without Steward's tables) nothing is created: a `listing` gets an empty store
    (and the line saying so on stderr), any other command the error (`NoSchema`)."""
    if absent_database(config) is not None:
        return _nothing()
    return _reading(config, listing)


@asynccontextmanager
async def _reading(config, listing: bool):
    from store.errors import NoSchema
    from store.read.reader import open_for_reading

    await asyncio.to_thread(make_private, config.home)
    try:
        store = await open_for_reading(config.store_url, snapshot_dir=snapshot_dir(config))
    except NoSchema as exc:
        if not listing:
            raise
        print(f"steward: {exc}: {NOTHING_YET}", file=sys.stderr, flush=True)
        yield _Empty()
        return
    try:
        yield store
    finally:
        await store.close()


def absent_database(config):
    """The SQLite file `config` names if it does not exist yet, else None (PostgreSQL:
    always None). A command that only reads must not create it (blocking: a stat)."""
    from store.read.reader import sqlite_path

    path = sqlite_path(config.store_url)
    return path if path is not None and not path.exists() else None


class NoDatabase(ValueError):
    """A command that reads something named found no database at all (exit 1)."""


NOTHING_YET = "nothing stored so far"
MADE_BY = "(the first `steward ask`, `chat`, `run` or `import` makes it)"


def no_database_line(config, path) -> str:
    where = f"in {config.home}" if path.parent == config.home else f"at {path}"
    return f"no database {where} yet: {NOTHING_YET}"


class _Empty:
    """The listings' reads of a database that does not exist: nothing in it."""

    async def list_conversations(self, **_):
        return []

    async def list_tasks(self, **_):
        return []

    async def list_schedules(self, **_):
        return []

    async def list_submissions(self, **_):
        return []

    async def spend_report(self, *_, **__):
        return []


@asynccontextmanager
async def _nothing():
    yield _Empty()
