"""`steward backup`: an online snapshot taken while Steward keeps writing, consistent (a
prefix of the commits, all of those made before it started), verified, rotated, encrypted
on request, on PostgreSQL through pg_dump, scheduled by `steward run` without state of its
own, and reported by `steward doctor`."""

import asyncio
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from bot.agent.inbox import submit_message
from bot.app.backup import (
    FAILED,
    BackupError,
    Damaged,
    list_backups,
    take_backup,
    verify_backup,
)
from bot.app.backup_config import every_seconds
from bot.app.backup_schedule import backup_status, keep_backing_up
from bot.app.config import ConfigError, build_config
from bot.app.doctor_checks import OK, WARN
from bot.attachments.blobs import BlobStore
from store import Writes, open_store
from tests.conftest import PG_URL
from tests.test_cli import steward, steward_env

ENTRIES = "SELECT id, conversation_id, seq, kind, text, ref FROM entries ORDER BY id"


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir(mode=0o700)
    return tmp_path / "home"


def config_of(home: Path, env: dict | None = None, **backup):
    return build_config({"backup": backup} if backup else {}, home=home, env=env or {})


def rows(db: Path, sql: str = ENTRIES) -> list[tuple]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


async def seeded(home: Path, entries: int = 3, pad: int = 0) -> None:
    """A home with a database of `entries` entries in one conversation (`pad` bytes of
    data each besides)."""
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    try:
        conv = await store.ensure_conversation("cli:seed")
        for start in range(0, entries, 2000):
            w = Writes()
            for n in range(start, min(entries, start + 2000)):
                w.append(conv.id, "user", f"hello {n}", ref=f"seed-{n}",
                         data={"pad": "x" * pad} if pad else None)
            await store.commit(w)
    finally:
        await store.close()


# -- under load, with a real `steward run` ------------------------------------------------


async def test_a_backup_under_load_holds_every_earlier_commit_and_a_new_home_starts_from_it(
        home, tmp_path):
    (home / "config.toml").write_text('[backup]\nkeep = 3\n')
    blob = await BlobStore.of_home(home).put(b"a picture, say")
    journal = b'{"event_id": "Ev1", "x": 1}\n{"done": "Ev1"}\n{"event_id": "Ev2", "x"'
    (home / "slack-inbox.jsonl").write_bytes(journal)  # its last line still being written
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    committed: dict[str, float] = {}  # ref -> when its commit returned
    stop = asyncio.Event()

    async def load() -> None:  # people writing; `steward run` answering each of them
        n = 0
        while not stop.is_set():
            ref = f"load-{n}"
            await submit_message(store, channel="cli", external_ids=[ref],
                                 conversation_key=f"cli:load{n % 3}", text=f"message {n}")
            committed[ref] = time.time()
            n += 1
            await asyncio.sleep(0.01)

    writer = asyncio.create_task(load())
    try:
        line = await asyncio.wait_for(run.stdout.readline(), 60)
        assert line.startswith(b"steward: running on sqlite"), line
        await asyncio.sleep(1.0)
        started = time.time()
        code, out, err = await steward(home, "backup", "--json")
        finished = time.time()
        assert code == 0, err
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await writer
        run.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(run.wait(), 60) == 0
        await store.close()
    made = json.loads(out)
    path = Path(made["path"])
    assert path.parent == home / "backups" and path.name.startswith("steward-backup-")
    manifest = verify_backup(path)  # every checksum re-read, integrity_check on the copy
    assert manifest["database"]["check"] == "integrity_check ok"
    copy, live = rows(path / "database/steward.db"), rows(home / "steward.db")
    # Steward kept writing while the copy was made, and answered (assistant entries)...
    during = rows(home / "steward.db", "SELECT count(*) FROM entries WHERE created_at "
                  f"BETWEEN {started} AND {finished}")[0][0]
    assert during > 0
    assert {r[3] for r in copy} >= {"user", "assistant"}
    # ...and the copy is exactly the commits up to one point: those made before it began
    # among them, nothing after it
    top = manifest["database"]["max_entry_id"]
    assert copy == [r for r in live if r[0] <= top] and len(live) > len(copy)
    assert manifest["database"]["entries"] == len(copy)
    refs = {r[5] for r in copy}
    before = {ref for ref, at in committed.items() if at < started}
    assert before and before <= refs
    # the side files: the journal cut after its last whole line, the blob, the config
    assert (path / "home/slack-inbox.jsonl").read_bytes() == journal[:journal.rfind(b"\n") + 1]
    assert (path / f"home/blobs/{blob[:2]}/{blob}").read_bytes() == b"a picture, say"
    assert (path / "home/config.toml").exists()
    listed = {f["path"] for f in manifest["files"]}
    assert not any(p.startswith(("home/steward.db", "home/runner.lock", "home/backups",
                                 "home/health.json")) for p in listed), listed
    assert os.stat(path).st_mode & 0o777 == 0o700
    # a fresh home from it answers as the old one did at the snapshot
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(path / "database/steward.db", fresh / "steward.db")
    code, out, err = await steward(fresh, "sessions", "--json")
    assert code == 0, err
    sessions = {s["key"]: s["entries"] for s in map(json.loads, out.splitlines())}
    assert sessions == {key: n for key, n in rows(
        path / "database/steward.db", "SELECT key, last_seq FROM conversations")}
    code, out, err = await steward(fresh, "log", "cli:load0", "--json", "--limit", "1000")
    assert code == 0, err
    logged = [e["entry"] for e in map(json.loads, out.splitlines())]
    assert sorted(logged) == list(range(1, sessions["cli:load0"] + 1))


async def test_the_event_loop_goes_on_while_a_backup_is_taken_in_process(home):
    """What `steward run`'s schedule does: the copy, the checks and the hashing all in
    threads, the process's own writes committing meanwhile."""
    await seeded(home, 6000, pad=8000)  # ~50 MB
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    conv = await store.ensure_conversation("cli:busy")
    backing_up = asyncio.Event()
    done = asyncio.Event()
    during, gaps = [0], [0.0]

    async def write() -> None:
        while not done.is_set():
            w = Writes()
            w.append(conv.id, "user", "more")
            await store.commit(w)
            during[0] += backing_up.is_set()
            await asyncio.sleep(0.002)

    async def tick() -> None:
        while not done.is_set():
            t = time.monotonic()
            await asyncio.sleep(0.005)
            if backing_up.is_set():
                gaps[0] = max(gaps[0], time.monotonic() - t - 0.005)

    tasks = [asyncio.create_task(write()), asyncio.create_task(tick())]
    try:
        await asyncio.sleep(0.1)
        backing_up.set()
        made = await take_backup(config_of(home))
        done.set()
        await asyncio.gather(*tasks)
    finally:
        done.set()
        await store.close()
    assert made.manifest["database"]["entries"] >= 6000
    assert during[0] > 0, "no commit while the backup was taken"
    # the loop never waited for the backup (~0.4 s here), only for the box's other work
    assert gaps[0] < max(0.1, made.seconds / 3), (gaps[0], made.seconds)


# -- verification, rotation --------------------------------------------------------------


async def test_a_damaged_backup_fails_verification_naming_the_file(home):
    await seeded(home)
    blob = await BlobStore.of_home(home).put(b"bytes of a file someone shared")
    made = await take_backup(config_of(home))
    path = made.path
    assert verify_backup(path)["files"]
    stored = path / f"home/blobs/{blob[:2]}/{blob}"
    stored.write_bytes(b"bytes of a file someone sharEd")  # one bit flipped, same size
    with pytest.raises(Damaged, match=f"home/blobs/{blob[:2]}/{blob}: its SHA-256 differs"):
        verify_backup(path)
    code, _, err = await steward(home, "backup", "--verify", str(path))
    assert code == 1
    assert err.startswith(f"steward: backup {path} is damaged: home/blobs/"), err
    assert "its SHA-256 differs from the manifest's (damaged)" in err
    # a database cut short, a missing file, a missing manifest
    db = path / "database/steward.db"
    db.write_bytes(db.read_bytes()[:4096])
    with pytest.raises(Damaged, match=r"database/steward.db: 4096 bytes, the manifest says"):
        verify_backup(path)
    stored.unlink()
    with pytest.raises(Damaged, match=r"\(and 1 more\)") as caught:
        verify_backup(path)
    assert f"home/blobs/{blob[:2]}/{blob}: missing" in caught.value.problems
    (path / "manifest.json").unlink()
    with pytest.raises(Damaged, match="manifest.json is missing"):
        verify_backup(path)
    # the home's own blob was never touched by any of this
    assert await BlobStore.of_home(home).get(blob) == b"bytes of a file someone shared"


async def test_a_good_backup_verifies_from_the_command_line(home):
    await seeded(home)
    made = await take_backup(config_of(home))
    code, out, err = await steward(home, "backup", "--verify", str(made.path), "--json")
    assert code == 0, err
    assert json.loads(out)["verified"] is True


async def test_rotation_keeps_the_newest_and_only_touches_its_own(home, tmp_path):
    await seeded(home)
    blob = await BlobStore.of_home(home).put(b"kept once, linked after")
    where = tmp_path / "backups"
    where.mkdir()
    theirs = [where / "steward-backup-19990101T000000Z", where / "holiday-photos"]
    for path in theirs:  # named like ours but no manifest of ours; not ours at all
        path.mkdir()
        (path / "manifest.json").write_text('{"format": "something else"}')
    config = config_of(home, dir=str(where), keep=2)
    made = [await take_backup(config) for _ in range(4)]
    kept = [path for path, _ in list_backups(where)]
    assert kept == [made[3].path, made[2].path]
    assert sorted(made[3].removed + made[2].removed) == sorted([made[0].path, made[1].path])
    assert all(path.exists() for path in theirs)
    # the same blob in consecutive backups is one file on disk
    rel = f"home/blobs/{blob[:2]}/{blob}"
    assert (made[3].path / rel).stat().st_ino == (made[2].path / rel).stat().st_ino
    assert made[3].linked == 1
    # a backup elsewhere (--to) rotates nothing
    other = await take_backup(config, tmp_path / "elsewhere")
    assert other.removed == [] and [p for p, _ in list_backups(where)] == kept


async def test_a_home_without_a_database_says_so(home):
    with pytest.raises(ValueError, match="no database at .*: nothing to back up yet"):
        await take_backup(config_of(home))
    assert not any(p.name.endswith(".partial") for p in (home / "backups").iterdir())
    assert "nothing to back up yet" in json.loads((home / "backups" / FAILED).read_text())[
        "error"]


# -- encryption ---------------------------------------------------------------------------


def decrypt(source: Path, target: Path, identity) -> None:
    from pyrage import decrypt_io

    with open(source, "rb") as src, open(target, "wb") as dst:
        decrypt_io(src, dst, [identity])


async def test_an_encrypted_backup_decrypts_to_the_same_home(home):
    from pyrage import passphrase, x25519

    await seeded(home, 50)
    blob = await BlobStore.of_home(home).put(b"private picture")
    identity = x25519.Identity.generate()
    env = {"BACKUP_PASS": "correct horse battery staple"}
    config = config_of(home, env, encrypt_to=str(identity.to_public()),
                       passphrase_env="BACKUP_PASS")
    made = await take_backup(config)
    manifest = verify_backup(made.path)  # the checksums of what is stored
    assert manifest["encryption"] == {"scheme": "age", "recipients": [str(identity.to_public())],
                                      "passphrase_key": "passphrase-key.age"}
    stored = {f["path"]: f for f in manifest["files"]}
    assert set(stored) == {"database/steward.db.age", f"home/blobs/{blob[:2]}/{blob}.age",
                           "passphrase-key.age"}
    assert b"hello" not in (made.path / "database/steward.db.age").read_bytes()
    assert not [p for p in home.iterdir() if p.name.startswith(".steward-stage-")]
    # with the passphrase: the key it guards opens every file
    key = passphrase.decrypt((made.path / "passphrase-key.age").read_bytes(), env["BACKUP_PASS"])
    for who in (identity, x25519.Identity.from_str(key.decode())):
        out = made.path.parent / "plain.db"
        out.unlink(missing_ok=True)
        decrypt(made.path / "database/steward.db.age", out, who)
        assert hashlib.sha256(out.read_bytes()).hexdigest() == \
            stored["database/steward.db.age"]["plain_sha256"]
        assert len(rows(out)) == 50
    with pytest.raises(ConfigError, match=r"\[backup\] encrypt_to: not an age recipient"):
        config_of(home, encrypt_to="age1notakey")
    with pytest.raises(ConfigError, match="environment variable NOPE is not set"):
        config_of(home, passphrase_env="NOPE")


# -- PostgreSQL ---------------------------------------------------------------------------


async def _pg(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_URL.replace("+asyncpg", ""))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture
async def pg_databases():
    names = [f"steward_backup_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for name in names:
        await _pg(f'CREATE DATABASE "{name}"')
    try:
        yield names
    finally:
        for name in names:
            await _pg(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_postgres_is_dumped_by_pg_dump_at_its_exact_position(home, pg_databases):
    source, target = pg_databases
    url = PG_URL.rsplit("/", 1)[0] + f"/{source}"
    store = await open_store(url)
    try:
        conv = await store.ensure_conversation("email:<a@b>")
        w = Writes()
        for n in range(30):
            w.append(conv.id, "user", f"mail {n}")
        await store.commit(w)
    finally:
        await store.close()
    config = build_config({"store": {"url": url}}, home=home, env={})
    made = await take_backup(config)
    database = made.manifest["database"]
    assert database["kind"] == "postgresql" and database["file"] == "database/steward.pgdump"
    assert (database["entries"], database["check"]) == (30, "pg_restore --list ok")
    assert database["revision"] and database["max_entry_id"]
    verify_backup(made.path)
    # the dump restores into an empty database with every entry
    dump = made.path / "database/steward.pgdump"
    server = make_url(PG_URL)
    host = ["--host", server.host, "--port", str(server.port or 5432),
            "--username", server.username]
    restore = shutil.which("pg_restore") or "pg_restore"
    restored = await asyncio.create_subprocess_exec(
        restore, *host, "--no-owner", "--dbname", target, str(dump),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await restored.communicate()
    assert restored.returncode == 0, err
    import asyncpg

    conn = await asyncpg.connect(PG_URL.replace("+asyncpg", "").rsplit("/", 1)[0]
                                 + f"/{target}")
    try:
        assert await conn.fetchval("SELECT count(*) FROM entries") == 30
    finally:
        await conn.close()
    # no pg_dump where the config says: a clear line, nothing left behind
    missing = build_config({"store": {"url": url}, "backup": {"pg_dump": "/nowhere/pg_dump"}},
                           home=home, env={})
    with pytest.raises(ValueError, match=r"pg_dump not found at /nowhere/pg_dump \(\[backup\] "
                                         r"pg_dump\)"):
        await take_backup(missing)
    assert [p for p, _ in list_backups(home / "backups")] == [made.path]


# -- the schedule and doctor ---------------------------------------------------------------


def test_every_reads_periods():
    assert every_seconds("1d") == 86400 and every_seconds("12h") == 43200
    assert every_seconds("30m") == 1800 and every_seconds(6) == 6 * 3600
    assert every_seconds("") is None
    for bad in ("soon", "10s", "0.5m"):
        with pytest.raises(ValueError):
            every_seconds(bad)
    with pytest.raises(ConfigError, match=r"\[backup\] dir: 'rel/dir' is relative"):
        build_config({"backup": {"dir": "rel/dir"}}, home=Path("/tmp"), env={})


async def test_the_schedule_keeps_its_state_on_disk(home):
    """Started again, the loop sees the backup it took and takes no other until due."""
    await seeded(home)
    config = config_of(home, every="1h")
    for _ in range(2):  # a start, then a restart
        loop = asyncio.create_task(keep_backing_up(config, start_delay=0, check_seconds=0.05))
        for _ in range(200):
            if list_backups(home / "backups"):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop
        assert len(list_backups(home / "backups")) == 1


async def test_steward_run_takes_a_scheduled_backup(home):
    await seeded(home)
    (home / "config.toml").write_text('[backup]\nevery = "1h"\n')
    run = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        for _ in range(300):
            if list_backups(home / "backups"):
                break
            await asyncio.sleep(0.2)
        assert list_backups(home / "backups")
        code, out, _ = await steward(home, "doctor", "--json")
        row = {r["check"]: r for r in map(json.loads, out.splitlines())}["backup"]
        assert row["status"] == OK and "last good backup" in row["detail"], row
    finally:
        run.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(run.wait(), 60) == 0


async def test_doctor_says_how_old_the_last_good_backup_is(home):
    await seeded(home)
    now = time.time()
    assert backup_status(config_of(home), now)[0] == OK  # nothing configured, none taken
    status, detail, fix = backup_status(config_of(home, every="1d"), now)
    assert (status, fix) == (WARN, "`steward backup` takes one now")
    assert "no backup in" in detail
    made = await take_backup(config_of(home))
    status, detail, _ = backup_status(config_of(home, every="1d"), time.time())
    assert status == OK and str(made.path) in detail
    status, detail, _ = backup_status(config_of(home, every="1d"), time.time() + 3 * 86400)
    assert status == WARN and "more than twice [backup] every (1.0 d)" in detail
    (home / "backups" / FAILED).write_text(json.dumps({"at": "2030-01-01T00:00:00.000000Z",
                                                       "error": "disk full"}))
    status, detail, _ = backup_status(config_of(home, every="1d"), time.time())
    assert status == WARN and "failed: disk full" in detail


async def test_a_failure_names_where(home, tmp_path):
    await seeded(home)
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    with pytest.raises(BackupError, match=f"backup into {blocked} failed"):
        await take_backup(config_of(home), blocked)
