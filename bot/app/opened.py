"""The store of this Steward, opened for a command or a whole process: the home made
private first (0700, its files 0600, as DESIGN.md says), closed when done. Light on
purpose: the reading commands import it without the agent."""

import asyncio
from contextlib import asynccontextmanager

from bot.home import make_private


@asynccontextmanager
async def _opened(config, open_fn):
    await asyncio.to_thread(make_private, config.home)
    store = await open_fn(config.store_url)
    try:
        yield store
    finally:
        await store.close()


def opened_store(config):
    """A database at this build's schema opens without Alembic (store.revision); one
    behind is migrated first, as every start does."""
    from store import open_store

    return _opened(config, open_store)


def opened_reader(config):
    """The store for a command that only reads: through the standard library when the
    database is SQLite at this build's schema (store/reader.py), else `opened_store`."""
    from store.reader import open_for_reading

    return _opened(config, open_for_reading)
