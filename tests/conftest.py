"""Shared fixtures: a fresh store on SQLite and on the local PostgreSQL server.

PostgreSQL isolation is one schema per test in database `test` (override the server with
STEWARD_TEST_PG_URL). The server is part of this project's machines, so an unreachable one
is a failure, not a skip.
"""

import os
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from store import open_store

PG_URL = os.environ.get("STEWARD_TEST_PG_URL",
                        "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
BACKENDS = ["sqlite", "postgres"]


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
