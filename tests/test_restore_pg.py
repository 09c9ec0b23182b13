"""`steward restore BACKUP --home DIR --store-url URL` for a home on PostgreSQL: the
backup's pg_dump goes into an empty database (bot/app/restore_pg.py), the new home's
config names that database, and nothing is restored over a database that holds tables.

Real `steward` processes against the local PostgreSQL server, each test with databases
of its own."""

from __future__ import annotations

import json
import tomllib
import uuid

import pytest

from bot.app.backup import take_backup
from bot.app.config import build_config
from store import Writes, open_store
from tests.conftest import PG_URL
from tests.test_backup import _pg
from tests.test_cli import steward, steward_env

SERVER = PG_URL.rsplit("/", 1)[0]


@pytest.fixture
async def databases():
    names = [f"steward_restore_{uuid.uuid4().hex[:10]}" for _ in range(3)]
    for name in names:
        await _pg(f'CREATE DATABASE "{name}"')
    try:
        yield names
    finally:
        for name in names:
            await _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def backed_up(tmp_path, url: str, entries: int = 25):
    """A home on `url` holding `entries` entries, and a backup of it."""
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(f'[store]\nurl = "{url}"\n')
    store = await open_store(url)
    try:
        conv = await store.ensure_conversation("email:<restored@example.com>")
        w = Writes()
        for n in range(entries):
            w.append(conv.id, "user", f"mail number {n}")
        await store.commit(w)
    finally:
        await store.close()
    made = await take_backup(build_config({"store": {"url": url}}, home=home, env={}))
    return home, made.path


async def count_entries(url: str) -> int:
    store = await open_store(url)
    try:
        conv = await store.get_conversation("email:<restored@example.com>")
        return len(await store.entries_page(conv.id, limit=1000))
    finally:
        await store.close()


@pytest.mark.parametrize("schema", [None, "steward_home"], ids=["database", "schema"])
async def test_a_postgres_backup_restores_into_an_empty_database(tmp_path, databases, schema):
    source, target, _ = databases
    url = f"{SERVER}/{source}"
    if schema:
        await _pg_in(source, f'CREATE SCHEMA "{schema}"')
        url += f"?schema={schema}"
    _, backup = await backed_up(tmp_path, url)
    fresh = tmp_path / "restored"
    plain = f"{SERVER}/{target}".replace("+asyncpg", "")  # the spelling people type
    code, out, err = await steward(fresh, "restore", str(backup), "--home", str(fresh),
                                   "--store-url", plain, cwd=tmp_path,
                                   env=steward_env(fresh))
    assert code == 0, err
    assert f"steward --home {fresh} --config {fresh / 'config.toml'} run" in out
    restored_url = tomllib.loads((fresh / "config.toml").read_text())["store"]["url"]
    assert f"/{target}" in restored_url and source not in restored_url
    assert ("schema=steward_home" in restored_url) == bool(schema)
    assert json.loads((fresh / "restored.json").read_text())["backup"] == backup.name
    assert not (fresh / "steward.db").exists()  # the dump went into the database
    assert await count_entries(restored_url) == 25
    # the restored home opens and reads it as any other (migrations at their head)
    code, out, err = await steward(fresh, "--config", str(fresh / "config.toml"), "log",
                                   "email:<restored@example.com>", env=steward_env(fresh),
                                   cwd=tmp_path)
    assert code == 0, err
    assert "mail number 24" in out


async def _pg_in(database: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(f"{SERVER.replace('+asyncpg', '')}/{database}")
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_a_postgres_backup_is_never_restored_over_a_database_with_tables(
        tmp_path, databases):
    source, target, other = databases
    _, backup = await backed_up(tmp_path, f"{SERVER}/{source}")
    await _pg_in(target, "CREATE TABLE kept (n int)")
    await _pg_in(target, "INSERT INTO kept VALUES (7)")
    fresh = tmp_path / "restored"
    code, _, err = await steward(fresh, "restore", str(backup), "--home", str(fresh),
                                 "--store-url", f"{SERVER}/{target}", cwd=tmp_path,
                                 env=steward_env(fresh))
    assert code == 1
    assert f"{target} is not empty" in err and "Traceback" not in err
    assert not fresh.exists() or not any(fresh.iterdir())
    # without a target: one line saying what to give
    code, _, err = await steward(fresh, "restore", str(backup), "--home", str(fresh),
                                 cwd=tmp_path, env=steward_env(fresh))
    assert code == 1 and "--store-url" in err and "Traceback" not in err
    # the live database is untouched, and the other target is still usable afterwards
    assert await count_entries(f"{SERVER}/{source}") == 25
    code, _, err = await steward(fresh, "restore", str(backup), "--home", str(fresh),
                                 "--store-url", f"{SERVER}/{other}", cwd=tmp_path,
                                 env=steward_env(fresh))
    assert code == 0, err
    assert await count_entries(f"{SERVER}/{other}") == 25
