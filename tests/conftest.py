"""Shared fixtures: a fresh store on SQLite and on PostgreSQL.

PostgreSQL isolation is one schema per test in database `test`. The server is the one
STEWARD_TEST_PG_URL names, else the local one at 127.0.0.1:5432, else a throwaway server
this run starts and stops (tests/pg_server.py): PostgreSQL tests never skip.
"""

import asyncio
import os
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from store import open_store
from tests import pg_server

# Set by `pytest_configure`, before any test module is imported (they import it by name).
PG_URL = os.environ.get(pg_server.ENV, pg_server.LOCAL)
BACKENDS = ["sqlite", "postgres"]
_started: pg_server.Throwaway | None = None


def pytest_configure(config):
    """Find or start the run's PostgreSQL server (once: xdist's workers inherit the URL)."""
    global PG_URL, _started
    PG_URL, _started = asyncio.run(pg_server.resolve())
    os.environ[pg_server.ENV] = PG_URL


def pytest_report_header(config):
    if _started is not None:
        return (f"postgresql: {PG_URL} (a throwaway server of this run, in "
                f"{_started.cluster.root})")
    return f"postgresql: {PG_URL}"


def pytest_unconfigure(config):
    if _started is not None:
        asyncio.run(_started.stop())


async def _pg_admin(sql: str) -> None:
    engine = create_async_engine(PG_URL)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


@pytest.fixture(params=BACKENDS)
async def store_url(request, tmp_path):
    """A URL for an empty store on each backend (tables not created yet)."""
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'steward.db'}"
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
async def store(store_url):
    s = await open_store(store_url)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def slack(request):
    """The fake Slack Web API and Socket Mode server (tests/fakes/slack_server.py), with the
    people a test module lists in `SLACK_PEOPLE` (default: Alice)."""
    from tests.fakes.slack_rig import ALICE
    from tests.fakes.slack_server import FakeSlack

    with FakeSlack() as fake:
        for user, name in getattr(request.module, "SLACK_PEOPLE", ((ALICE, "Alice"),)):
            fake.add_user(user, name)
        yield fake
