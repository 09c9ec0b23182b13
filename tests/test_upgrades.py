"""Upgrades that cannot break a home (DESIGN guarantee 10).

Every earlier schema revision's database, written by that release's own code
(tests/fixtures/schemas/, made by its make.py), opens in this build on both backends: the
start-up path takes a snapshot, migrates, and the history reads as it was written
(conversations and a fork, entries found by search, tasks, schedules, documents,
submissions, usage), and takes new writes and claims. A snapshot that cannot be taken
stops the migration with one line and changes nothing; a database migrated by a newer
Steward is refused with one line, never downgraded.
"""

import asyncio
import gzip
import json
import os
import re
import sqlite3
import subprocess
import uuid
from pathlib import Path

import asyncpg
import pytest
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory

from store import Writes, conversation_namespace, open_store
from store.engine import MIGRATIONS, create_engines, migrate
from store.errors import NewerSchema, SnapshotFailed
from store.revision import HEAD
from tests.conftest import PG_URL, _pg_admin
from tests.test_cli import steward

FIXTURES = Path(__file__).parent / "fixtures" / "schemas"


def _revisions() -> list[str]:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return [s.revision for s in reversed(list(ScriptDirectory.from_config(cfg).walk_revisions()))]


REVISIONS = _revisions()
EARLIER = [r for r in REVISIONS if r != HEAD]

CONVERSATION = ["we climbed the Zugspitze last summer",
                "Grüße aus der Straße: the Zugspitze is 2962 m high",
                "去年的饺子很好吃", "earlier: Zugspitze", "a system note about the Zugspitze"]
FERRY = ["is the ferry running tomorrow", "the ferry runs at nine"]


def test_every_earlier_revision_has_its_databases():
    """A new migration makes the revision before it an earlier one: its release's
    databases must be made (tests/fixtures/schemas/make.py, RELEASES)."""
    assert REVISIONS[-1] == HEAD
    for rev in EARLIER:
        assert (FIXTURES / f"{rev}.db.gz").is_file(), f"run make.py for {rev}"
        assert _pg_rows_of(rev) is not None, f"run make.py for {rev}"


def _pg_rows_of(rev: str) -> str | None:
    """The release whose PostgreSQL rows make a database at `rev` (itself, or for a
    revision no release stopped at, the newest release before it)."""
    for earlier in reversed(REVISIONS[:REVISIONS.index(rev) + 1]):
        if (FIXTURES / f"{earlier}.pg.sql").is_file():
            return earlier
    return None


# -- what every upgraded database must hold ------------------------------------------------


async def assert_history_intact(store, rev: str) -> None:
    a = await store.get_conversation("cli:fixture")
    b = await store.get_conversation("slack:T1:D1")
    fork = await store.get_conversation("cli:fixture-fork")
    assert fork.parent_id == a.id
    assert [e.text for e in await store.entries_page(a.id)] == CONVERSATION
    assert [e.text for e in await store.entries_page(b.id)] == FERRY
    assert [e.text for e in await store.entries_page(fork.id)] == CONVERSATION[:2]

    async def found(query: str) -> set[str]:
        return {h.entry.text for h in await store.search(query, limit=20)}

    # the quoted search result and the system note are not searchable, as ever
    assert await found("Zugspitze") == set(CONVERSATION[:2])
    assert await found("饺子") == {CONVERSATION[2]}
    assert await found("ferry") == set(FERRY)

    tasks = {t.kind: t for t in await store.list_tasks(limit=100)}
    assert set(tasks) == {"fixture.done", "fixture.pending", "fixture.child",
                          "fixture.deliver"}
    done = tasks["fixture.done"]
    assert (done.state, done.result) == ("done", {"answer": 42})
    assert tasks["fixture.pending"].state == "pending"
    assert tasks["fixture.pending"].inputs == {"n": 2}
    assert (tasks["fixture.child"].state, tasks["fixture.child"].parent_id) == ("pending",
                                                                                done.id)
    assert tasks["fixture.deliver"].idem_key == "fixture-key"

    schedules = await store.list_schedules()
    if rev >= "0002":
        [s] = schedules
        assert (s.name, s.trigger, s.timezone, s.conversation_id) == (
            "water the plants", {"kind": "cron", "expr": "0 9 * * mon"}, "Europe/Berlin", a.id)
    else:
        assert schedules == []

    doc = await store.read_document(conversation_namespace(a.id), "todo")
    assert doc.value == {"items": ["buy milk", "water plants"]}
    assert (await store.read_document(conversation_namespace(a.id), "todo", version=1)
            ).value == {"items": ["buy milk"]}
    forked = await store.read_document(conversation_namespace(fork.id), "todo")
    assert forked.value == {"items": ["buy milk", "water plants"]}

    assert (await store.submission_state("slack", "T1:D1:1700000000.1"))["state"] == "accepted"
    [q] = await store.list_submissions(state="quarantined")
    assert (q["external_id"], q["reason"]) == ("<broken@example.org>", "malformed MIME")
    totals = await store.usage_totals()
    assert (totals["calls"], totals["input_tokens"], totals["output_tokens"]) == (1, 120, 30)
    assert float(totals["cost_usd"]) == pytest.approx(0.002)


async def assert_it_goes_on(store) -> None:
    """The upgraded database takes new history, finds it, and runs the old pending work."""
    a = await store.get_conversation("cli:fixture")
    w = Writes()
    w.append(a.id, "user", "after the upgrade: the Watzmann", author="anna")
    await store.commit(w)
    assert {h.entry.text for h in await store.search("Watzmann")} == {
        "after the upgrade: the Watzmann"}
    claimed = await store.claim_tasks("upgrade-test", 10, 60.0)
    assert {t.kind for t in claimed} == {"fixture.pending", "fixture.child", "fixture.deliver"}


# -- SQLite: the real start-up path ------------------------------------------------------


def unpack(rev: str, home: Path) -> Path:
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    db = home / "steward.db"
    db.write_bytes(gzip.decompress((FIXTURES / f"{rev}.db.gz").read_bytes()))
    return db


def revision_of(db: Path) -> str:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    finally:
        conn.close()


def assert_snapshot_of(snapshot: Path, rev: str) -> None:
    assert re.fullmatch(rf"steward-{rev}-to-{HEAD}-\d{{8}}T\d{{6}}Z\.db", snapshot.name)
    assert snapshot.stat().st_mode & 0o077 == 0
    conn = sqlite3.connect(f"file:{snapshot}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == rev
        assert [r[0] for r in conn.execute("SELECT text FROM entries ORDER BY id")] == [
            *CONVERSATION, *FERRY]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()


@pytest.mark.parametrize("rev", EARLIER)
async def test_a_sqlite_database_of_every_earlier_revision_upgrades(rev, tmp_path):
    home = tmp_path / "home"
    db = unpack(rev, home)
    # What a person runs first after upgrading Steward: a reading command, which migrates.
    code, out, err = await steward(home, "search", "Zugspitze", "--json")
    assert code == 0, err
    assert {json.loads(line)["text"] for line in out.splitlines()} == set(CONVERSATION[:2])
    [snapshot] = (home / "snapshots").iterdir()
    assert_snapshot_of(snapshot, rev)
    assert f"migrating the database from {rev} to {HEAD}; a snapshot of it as it was is " \
           f"in {snapshot}" in err
    assert revision_of(db) == HEAD
    code, out, err = await steward(home, "tasks", "--json")
    assert code == 0, err
    assert sorted(json.loads(line)["kind"] for line in out.splitlines()) == [
        "fixture.child", "fixture.deliver", "fixture.done", "fixture.pending"]

    store = await open_store(f"sqlite+aiosqlite:///{db}")
    try:
        assert store.upgrade is None  # at head now: nothing more to do, no second snapshot
        await assert_history_intact(store, rev)
        await assert_it_goes_on(store)
    finally:
        await store.close()
    assert len(list((home / "snapshots").iterdir())) == 1


async def test_db_upgrade_says_where_the_snapshot_is(tmp_path):
    home = tmp_path / "home"
    unpack(EARLIER[-1], home)
    code, out, err = await steward(home, "db", "upgrade")
    assert code == 0, err
    [snapshot] = (home / "snapshots").iterdir()
    assert out.strip() == (f"database migrated from {EARLIER[-1]} to {HEAD}; a snapshot of it "
                           f"as it was is in {snapshot}")
    code, out, _ = await steward(home, "db", "upgrade")
    assert (code, out.strip()) == (0, "database is up to date")
    assert len(list((home / "snapshots").iterdir())) == 1


async def test_no_snapshot_for_a_new_database_or_one_at_head(tmp_path):
    db = tmp_path / "steward.db"
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    assert store.upgrade.before is None and store.upgrade.snapshot is None
    await store.close()
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    assert store.upgrade is None
    await store.close()
    assert not (tmp_path / "snapshots").exists()


async def test_the_last_few_snapshots_are_kept(tmp_path):
    from store import snapshot

    folder = tmp_path / "snapshots"
    folder.mkdir()
    for n in range(snapshot.KEEP + 3):
        old = folder / snapshot.name("0001", "0002", ".db", t=1_700_000_000 + n)
        old.write_bytes(b"")
        os.utime(old, (1_700_000_000 + n, 1_700_000_000 + n))
    (folder / "steward-0001-to-0002-x.db.partial").write_bytes(b"")  # a crash's leftover
    (folder / "mine.txt").write_text("not a snapshot")
    db = unpack(EARLIER[-1], tmp_path / "home")
    store = await open_store(f"sqlite+aiosqlite:///{db}", snapshot_dir=folder)
    await store.close()
    kept = sorted(p.name for p in folder.iterdir())
    assert "mine.txt" in kept and store.upgrade.snapshot.name in kept
    assert len([k for k in kept if k.startswith("steward-")]) == snapshot.KEEP
    assert not any(k.endswith(".partial") for k in kept)
    assert "steward-0001-to-0002-20231114T221327Z.db" in kept  # the newest old ones stay
    assert "steward-0001-to-0002-20231114T221320Z.db" not in kept


async def test_no_snapshot_no_migration(tmp_path):
    """A snapshot that cannot be taken (here: `snapshots` is a file) stops the upgrade:
    one line, exit 1, the database as it was."""
    home = tmp_path / "home"
    rev = EARLIER[-1]
    db = unpack(rev, home)
    (home / "snapshots").write_text("in the way")
    before = db.read_bytes()
    with pytest.raises(SnapshotFailed):
        await open_store(f"sqlite+aiosqlite:///{db}")  # (default: snapshots/ beside it)
    code, out, err = await steward(home, "sessions")
    assert code == 1 and out == ""
    assert err == (f"steward: cannot take a snapshot of the database before migrating it from "
                   f"{rev} to {HEAD}, so it was not migrated (nothing changed): "
                   f"{home / 'snapshots'}: File exists ({home / 'snapshots'}); free space "
                   "there (or point [store] at a disk with room), or back the database up "
                   "yourself and then run `steward db upgrade --no-snapshot`\n")
    assert revision_of(db) == rev and db.read_bytes() == before
    code, out, err = await steward(home, "db", "upgrade", "--no-snapshot")
    assert (code, out.strip()) == (0, f"database migrated from {rev} to {HEAD} (no snapshot "
                                      "taken)"), err
    assert revision_of(db) == HEAD


async def test_a_database_from_a_newer_steward_is_refused_in_one_line(tmp_path):
    home = tmp_path / "home"
    db = unpack(EARLIER[-1], home)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    line = (f"steward: the database ({db}) was written by a newer Steward: its schema is at "
            f"revision 9999, and steward {_version()} knows revisions up to {HEAD}; upgrade "
            "Steward to the version that wrote it (or restore the snapshot taken before that "
            "upgrade); nothing was changed\n")
    for argv in (["sessions"], ["db", "upgrade"], ["ask", "hello"], ["search", "ferry"]):
        code, out, err = await steward(home, *argv)
        assert (code, out, err) == (1, "", line), argv
    assert db.read_bytes() == before and not (home / "snapshots").exists()
    with pytest.raises(NewerSchema):
        await open_store(f"sqlite+aiosqlite:///{db}")


def _version() -> str:
    from importlib.metadata import version

    return version("steward")


# -- PostgreSQL: the release's rows in the schema its migrations made --------------------


@pytest.fixture
async def pg_schema():
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE SCHEMA "{schema}"')
    try:
        yield schema
    finally:
        await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


async def load_rows(schema: str, sql: str) -> None:
    """The release's rows, each INSERT in a savepoint: one whose parent row comes later in
    the dump (a task's parent, a fork's) is tried again after the others."""
    conn = await asyncpg.connect(PG_URL.replace("+asyncpg", ""),
                                 server_settings={"search_path": schema})
    try:
        async with conn.transaction():
            pending = [line for line in sql.splitlines() if line and not line.startswith("--")]
            while pending:
                later = []
                for statement in pending:
                    try:
                        async with conn.transaction():
                            await conn.execute(statement)
                    except asyncpg.ForeignKeyViolationError:
                        later.append(statement)
                assert len(later) < len(pending), later
                pending = later
    finally:
        await conn.close()


async def postgres_at(rev: str, schema: str) -> str:
    url = f"{PG_URL}?schema={schema}"
    release = _pg_rows_of(rev)
    engines = create_engines(url)
    try:
        await migrate(engines, release)
        await load_rows(schema, (FIXTURES / f"{release}.pg.sql").read_text())
        if rev != release:
            await migrate(engines, rev)
    finally:
        await engines.dispose()
    return url


@pytest.mark.parametrize("rev", EARLIER)
async def test_a_postgresql_database_of_every_earlier_revision_upgrades(rev, pg_schema,
                                                                        tmp_path):
    url = await postgres_at(rev, pg_schema)
    store = await open_store(url, snapshot_dir=tmp_path / "snapshots")
    try:
        upgrade = store.upgrade
        assert (upgrade.before, upgrade.after) == (rev, HEAD)
        assert re.fullmatch(rf"steward-{rev}-to-{HEAD}-\d{{8}}T\d{{6}}Z\.dump",
                            upgrade.snapshot.name)
        await assert_history_intact(store, rev)
        await assert_it_goes_on(store)
    finally:
        await store.close()
    listing = await asyncio.to_thread(subprocess.run, ["pg_restore", "--list",
                                                       str(upgrade.snapshot)],
                                      capture_output=True, text=True, check=True)
    assert f"TABLE DATA {pg_schema} entries " in listing.stdout
    assert f"TABLE DATA {pg_schema} alembic_version " in listing.stdout


async def test_postgresql_without_pg_dump_is_refused_until_told(pg_schema, tmp_path):
    rev = EARLIER[-1]
    url = await postgres_at(rev, pg_schema)
    home = tmp_path / "home"
    home.mkdir()
    config = home / "config.toml"
    config.write_text(f'[store]\nurl = "{url}"\n')
    from tests.test_cli import steward_env

    env = steward_env(home, PATH="/nonexistent")  # no pg_dump on it
    code, out, err = await steward(home, "--config", str(config), "sessions", env=env)
    assert (code, out) == (1, "")
    assert err == (f"steward: cannot take a snapshot of the database before migrating it from "
                   f"{rev} to {HEAD}, so it was not migrated (nothing changed): pg_dump is not "
                   "installed (apt install postgresql-client, or your system's PostgreSQL "
                   "client package); install it, or back the database up yourself and then "
                   "run `steward db upgrade --no-snapshot`\n")
    engines = create_engines(url)
    try:
        from store.revision import current

        assert await current(engines) == rev
        code, out, err = await steward(home, "--config", str(config), "db", "upgrade",
                                       "--no-snapshot", env=env)
        assert (code, out.strip()) == (0, f"database migrated from {rev} to {HEAD} (no "
                                          "snapshot taken)"), err
        assert await current(engines) == HEAD
    finally:
        await engines.dispose()
    assert not (home / "snapshots").exists()


async def test_a_postgresql_database_from_a_newer_steward_is_refused(pg_schema):
    url = await postgres_at(EARLIER[-1], pg_schema)
    await _pg_admin(f'UPDATE "{pg_schema}".alembic_version SET version_num = \'9999\'')
    with pytest.raises(NewerSchema, match="its schema is at revision 9999, and steward .* "
                       f"knows revisions up to {HEAD}; "):
        await open_store(url, snapshot_dir=Path("/nonexistent"))
