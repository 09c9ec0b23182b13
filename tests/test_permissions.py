"""Files in the home directory are private to their owner (DESIGN guarantee 7): the home is
0700, the database, its WAL and shared-memory files, the runner lock and the Slack journal
0600, whatever the umask, and an older home left readable is tightened on start. A real
`steward ask` (scripted model, no network) first, then each piece on its own under a
permissive umask."""

import asyncio
import os
import stat
import sys
from pathlib import Path

import pytest

from bot.home import make_private
from bot.runtime.lock import RunnerLock
from connectors.slack.journal import Journal
from store import Writes, open_store


def mode(path: Path) -> str:
    """'0o600': octal, so that a failing assertion reads like `ls -l`."""
    return oct(stat.S_IMODE(path.lstat().st_mode))


def modes(home: Path) -> dict[str, str]:
    """The mode of the home and of everything in it, by name relative to the home."""
    found = {".": mode(home)}
    for path in sorted(home.rglob("*")):
        found[str(path.relative_to(home))] = mode(path)
    return found


def private(found: dict[str, str]) -> dict[str, str]:
    return {name: "0o700" if name == "." else "0o600" for name in found}


async def steward(home: Path, config: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "XDG_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), STEWARD_CONFIG=str(config))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=env, cwd=config.parent,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


@pytest.fixture
def permissive_umask():
    """What a careless login shell has: new files 0644, new directories 0755."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def config(tmp_path) -> Path:
    path = tmp_path / "config.toml"  # outside the home, as a user's config usually is
    path.write_text('[llm]\nprovider = "scripted"\n')
    return path


async def test_steward_ask_leaves_a_private_home(tmp_path, config, permissive_umask):
    home = tmp_path / "data" / "steward"  # not there yet: steward makes it
    code, out, err = await steward(home, config, "ask", "hello there")
    assert code == 0, err
    assert out.strip()
    found = modes(home)
    assert {"steward.db", "runner.lock"} <= found.keys()
    assert found == private(found)


async def test_steward_ask_tightens_a_home_an_older_version_left_readable(
        tmp_path, config, permissive_umask):
    home = tmp_path / "home"
    code, _, err = await steward(home, config, "ask", "first")
    assert code == 0, err
    # as an older version left it: everything readable by group and others
    home.chmod(0o755)
    for path in home.iterdir():
        path.chmod(0o644)
    for name in ("steward.db-wal", "steward.db-shm", "slack-inbox.jsonl", "notes.txt"):
        if not (home / name).exists():
            (home / name).write_text("")
            (home / name).chmod(0o644)
    outside = tmp_path / "shared.txt"
    outside.write_text("not steward's")
    outside.chmod(0o644)
    (home / "link").symlink_to(outside)
    assert mode(home / "steward.db") == "0o644"

    code, _, err = await steward(home, config, "ask", "second")
    assert code == 0, err
    found = modes(home)
    del found["link"]  # a symlink's own mode means nothing; its target is not ours to change
    assert found == private(found)
    assert mode(outside) == "0o644"


async def test_the_database_and_its_wal_and_shm_are_created_private(tmp_path,
                                                                    permissive_umask):
    db = tmp_path / "new" / "steward.db"
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    try:
        conv = await store.ensure_conversation("cli:x")
        w = Writes()
        w.append(conv.id, "user", "hi")
        await store.commit(w)
        wal, shm = db.with_name("steward.db-wal"), db.with_name("steward.db-shm")
        assert wal.exists() and shm.exists()  # open: WAL mode keeps them
        assert [mode(p) for p in (db.parent, db, wal, shm)] == ["0o700"] + ["0o600"] * 3
        # an older version's files, loosened while open: the next open tightens them
        for path in (db, wal, shm):
            path.chmod(0o644)
        second = await open_store(f"sqlite+aiosqlite:///{db}")
        await second.close()
        assert (mode(db), mode(wal), mode(shm)) == ("0o600", "0o600", "0o600")
    finally:
        await store.close()


def test_the_runner_lock_makes_the_home_private(tmp_path, permissive_umask):
    fresh = RunnerLock(tmp_path / "fresh" / "runner.lock")
    assert fresh.try_acquire()
    fresh.release()
    assert (mode(tmp_path / "fresh"), mode(fresh.path)) == ("0o700", "0o600")

    home = tmp_path / "old"
    home.mkdir(mode=0o755)
    (home / "runner.lock").write_text("")
    (home / "steward.db").write_text("")
    (home / "script.sh").write_text("")
    (home / "script.sh").chmod(0o755)
    (home / "sub").mkdir()
    old = RunnerLock(home / "runner.lock")
    assert old.try_acquire()
    try:
        assert modes(home) == {".": "0o700", "runner.lock": "0o600", "script.sh": "0o700",
                               "steward.db": "0o600", "sub": "0o755"}  # owner bits kept
    finally:
        old.release()


def test_a_shared_directory_is_not_changed(tmp_path, permissive_umask):
    shared = tmp_path / "tmp-like"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "someone-elses").write_text("")
    (shared / "someone-elses").chmod(0o644)
    make_private(shared)
    assert (mode(shared), mode(shared / "someone-elses")) == ("0o1777", "0o644")


async def test_the_slack_journal_is_private(tmp_path, permissive_umask):
    path = tmp_path / "slack-inbox.jsonl"
    journal = Journal(path)
    assert await journal.open() == []
    await journal.append({"event_id": "Ev1", "event": {"text": "hi"}})
    await journal.close()
    assert mode(path) == "0o600"

    path.chmod(0o644)  # an older version's journal: tightened when opened, events kept
    again = Journal(path)
    assert [b["event_id"] for b in await again.open()] == ["Ev1"]
    await again.close()
    assert mode(path) == "0o600"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # no database in the home
async def test_the_slack_connector_makes_a_new_home_private(store, tmp_path, permissive_umask):
    """The connector creates the home when it is the first to need it (its journal lives
    there): 0700, as every other path that creates it."""
    from tests.fakes.slack_rig import SlackRig
    from tests.fakes.slack_server import FakeSlack

    home = tmp_path / "fresh" / "home"
    with FakeSlack() as slack:
        async with SlackRig(store, home, slack):
            pass
    assert modes(home) == private(modes(home)), modes(home)
