"""A crash left without its -wal is noticed, not silently lived with (store/wal_guard.py).

A real process commits entries and is killed with SIGKILL, so the commits are in
`steward.db-wal` only; the -wal is deleted, as people do when "the database is locked".
Then `steward run` refuses to start with one line saying what was lost and what to do,
`steward doctor` fails its database row with the same, and `steward run
--accept-data-loss` starts (once; later starts need nothing). Putting the -wal back
instead brings the commits back.
"""

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import sys
import time
from pathlib import Path

import pytest

from store import Writes, open_store
from store.errors import LostCommits
from store.wal_guard import Marks, read_state, state_path
from tests.test_cli import steward, steward_env

ROOT = Path(__file__).resolve().parent.parent
N = 20

# A life of Steward that commits N entries, one commit each, then waits to be killed.
WRITER = f"""
import asyncio, sys
from store import Writes, open_store

async def main(db):
    store = await open_store(f"sqlite+aiosqlite:///{{db}}")
    conv = await store.ensure_conversation("cli:lost")
    for n in range({N}):
        w = Writes()
        w.append(conv.id, "user", f"entry {{n}}", author="anna")
        await store.commit(w)
    print("written", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1]))
"""


def entries(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM entries").fetchone()[0]
    finally:
        conn.close()


def wal_size(db: Path) -> int | None:
    wal = Path(f"{db}-wal")
    return wal.stat().st_size if wal.exists() else None


def user_version(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()


async def home_with_commits_only_in_the_wal(tmp_path) -> Path:
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    db = home / "steward.db"
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    await store.ensure_conversation("cli:kept")
    await store.close()  # a clean stop: checkpointed, no -wal left
    assert wal_size(db) is None

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WRITER, str(db), cwd=ROOT, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert await asyncio.wait_for(proc.stdout.readline(), 60) == b"written\n"
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert wal_size(db) > 0
    assert entries(db) == N  # read through the -wal: every commit is there
    return home


def expected_line(db: Path) -> str:
    mark, at = read_state(state_path(db))
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    return (f"steward: the database {db} is missing commits this home saw land: it is at "
            f"commit mark {user_version(db)}, but was already at {mark} at {when} (its "
            f"steward.db-wal was probably deleted after a crash); with Steward stopped, put "
            f"steward.db-wal back beside it if you still have it, or restore a backup; to go "
            f"on with the database as it is (those commits are lost), start once with "
            f"`steward run --accept-data-loss`")


async def start_run(home, *args):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", *args, env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    return proc, line


async def stop(proc) -> bytes:
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err
    return err


async def test_a_deleted_wal_after_a_kill_is_reported_and_run_refuses(tmp_path):
    home = await home_with_commits_only_in_the_wal(tmp_path)
    db = home / "steward.db"
    os.unlink(f"{db}-wal")
    assert entries(db) == 0  # the N commits are gone; SQLite opens the older file happily
    line = expected_line(db)

    code, out, err = await steward(home, "run")
    assert (code, out, err) == (1, "", line + "\n")
    code, out, err = await steward(home, "ask", "hello")  # nothing else writes on it either
    assert (code, err) == (1, line + "\n")

    code, out, _ = await steward(home, "doctor", "--json")
    assert code == 1
    [row] = [json.loads(r) for r in out.splitlines() if json.loads(r)["check"] == "database"]
    assert row["status"] == "fail"
    assert "steward: " + row["detail"] + "; " + row["fix"] == line

    proc, first = await start_run(home, "--accept-data-loss")
    assert first.startswith(b"steward: running on sqlite"), first
    err = await stop(proc)
    assert (line.replace("steward: ", "steward: accepted the loss: ", 1).split("; with ")[0]
            + "; going on with the database as it is").encode() in err
    # accepted once: the next start needs nothing, and doctor is content
    proc, first = await start_run(home)
    assert first.startswith(b"steward: running on sqlite"), first
    await stop(proc)
    code, out, _ = await steward(home, "doctor", "--json")
    [row] = [json.loads(r) for r in out.splitlines() if json.loads(r)["check"] == "database"]
    assert row["status"] == "ok", row
    code, out, _ = await steward(home, "sessions", "--json")
    assert [json.loads(r)["key"] for r in out.splitlines()] == ["cli:kept"]


async def test_the_wal_put_back_brings_the_commits_back(tmp_path):
    home = await home_with_commits_only_in_the_wal(tmp_path)
    db = home / "steward.db"
    kept = tmp_path / "kept-wal"
    shutil.move(f"{db}-wal", kept)
    with pytest.raises(LostCommits):
        await open_store(f"sqlite+aiosqlite:///{db}")
    shutil.move(kept, f"{db}-wal")
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    try:
        conv = await store.get_conversation("cli:lost")
        assert len(await store.entries_page(conv.id, limit=100)) == N
    finally:
        await store.close()
    code, out, err = await steward(home, "doctor", "--json")
    [row] = [json.loads(r) for r in out.splitlines() if json.loads(r)["check"] == "database"]
    assert row["status"] == "ok", row


async def test_clean_stops_and_kills_with_the_wal_kept_raise_no_alarm(tmp_path):
    home = await home_with_commits_only_in_the_wal(tmp_path)  # killed, -wal kept
    db = home / "steward.db"
    for _ in range(3):
        store = await open_store(f"sqlite+aiosqlite:///{db}")
        conv = await store.ensure_conversation("cli:more")
        w = Writes()
        w.append(conv.id, "user", "more", author="anna")
        await store.commit(w)
        await store.close()
    assert read_state(state_path(db))[0] <= user_version(db)
    assert state_path(db).stat().st_mode & 0o077 == 0


async def test_marks_are_made_at_most_once_a_second_not_per_commit(tmp_path):
    db = tmp_path / "steward.db"
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    try:
        conv = await store.ensure_conversation("cli:busy")
        start = user_version(db)
        began = time.monotonic()
        for n in range(200):
            w = Writes()
            w.append(conv.id, "user", f"n {n}")
            await store.commit(w)
        took = time.monotonic() - began
        assert user_version(db) - start <= took + 1
        assert read_state(state_path(db))[0] == user_version(db)
    finally:
        await store.close()


async def test_a_damaged_note_is_ignored_and_written_again(tmp_path):
    db = tmp_path / "steward.db"
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    await store.ensure_conversation("cli:x")
    await store.close()
    state_path(db).write_text("{not json")
    store = await open_store(f"sqlite+aiosqlite:///{db}")  # opens all the same
    try:
        w = Writes()
        w.append((await store.get_conversation("cli:x")).id, "user", "hi")
        await store.commit(w)
    finally:
        await store.close()
    assert read_state(state_path(db)) is not None


def test_a_mark_is_raised_inside_the_transaction_it_rides_on(tmp_path):
    """Rolled back with its transaction: a note is written only for a committed mark."""
    db = tmp_path / "x.db"
    conn = sqlite3.connect(db, isolation_level=None)
    marks = Marks(db, every=0)
    conn.execute("BEGIN IMMEDIATE")
    assert marks.stamp(conn) == 1
    conn.execute("ROLLBACK")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert not state_path(db).exists()
    conn.execute("BEGIN IMMEDIATE")
    mark = marks.stamp(conn)
    conn.execute("COMMIT")
    marks.stamped(mark)
    assert read_state(state_path(db))[0] == 1 == conn.execute("PRAGMA user_version").fetchone()[0]
    conn.close()
