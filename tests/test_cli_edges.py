"""The command line at its edges: a reader that closes the pipe early, a home with no
database yet, `--config` naming a directory, and Ctrl-C in the middle of a large import.
Real `steward` subprocesses (a pseudo-terminal where the terminal matters), real SQLite."""

import asyncio
import json
import os
import pty
import re
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from store import Writes, open_store
from tests.test_cli import interruptible, steward, steward_env

ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


async def test_a_reader_that_stops_early_gets_no_error(home):
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    conv = await store.ensure_conversation("cli:long")
    w = Writes()
    for n in range(3000):  # far more than a pipe holds
        w.append(conv.id, "user", f"message {n}", author="ana")
    await store.commit(w)
    await store.close()
    script = (f"{sys.executable} -m bot log cli:long --json --limit 5000 2>{home / 'err'} "
              "| head -2; echo ${PIPESTATUS[0]} >" + str(home / "code"))
    done = await asyncio.to_thread(subprocess.run, ["bash", "-c", script], cwd=home,
                                   env=steward_env(home), capture_output=True, text=True,
                                   timeout=120)
    assert [json.loads(line)["text"] for line in done.stdout.splitlines()] == [
        "message 0", "message 1"]
    assert (home / "err").read_text() == ""  # no "unexpected error", no traceback
    assert (home / "code").read_text().strip() == "141"  # as `seq 1 100000 | head -2`


LISTINGS = {"sessions": "no conversations yet", "tasks": "no tasks",
            "schedules": "no active schedules (--all also lists finished and cancelled ones)",
            "quarantine": "nothing quarantined", "usage": "no model calls in the last 30 days",
            "facts": "no facts kept"}
NAMED = (["log", "cli:default"], ["search", "hello"], ["doc", "cli:default", "todo"],
         ["context", "cli:default"], ["export", "--to", "out"], ["web", "--port", "0"])


async def test_reading_a_home_with_no_database_says_so_and_creates_nothing(home, tmp_path):
    fresh = tmp_path / "fresh"
    # a home not there at all (every command), and one there without a database (two)
    for where, listings, named in ((fresh, LISTINGS, NAMED), (home, ["sessions"], NAMED[:1])):
        env = steward_env(where)
        for command in listings:
            code, out, err = await steward(where, command, cwd=tmp_path, env=env)
            assert (code, out) == (0, LISTINGS[command] + "\n"), (command, err)
            assert err == f"steward: no database in {where} yet: nothing stored so far\n", \
                command
            if command in ("sessions", "facts"):
                code, out, err = await steward(where, command, "--json", cwd=tmp_path,
                                               env=env)
                assert (code, out) == (0, ""), (command, err)
        for command in named:
            code, out, err = await steward(where, *command, cwd=tmp_path, env=env)
            assert (code, out) == (1, ""), command
            assert err == (f"steward: no database in {where} yet: nothing stored so far (the "
                           "first `steward ask`, `chat`, `run` or `import` makes it)\n"), command
    assert not fresh.exists()
    assert [p.name for p in home.iterdir() if p.name.startswith("steward.db")] == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_reading_an_empty_postgresql_database_creates_no_tables(home, tmp_path, store_url):
    """On PostgreSQL "no database yet" is a database (here a schema) without Steward's
    tables: the reading commands say so as on SQLite and leave it as they found it."""
    (tmp_path / "config.toml").write_text(f'[store]\nurl = "{store_url}"\n')  # in the cwd
    schema = store_url.rpartition("schema=")[2]
    nothing = (f"steward: no Steward tables in PostgreSQL database 'test' (schema {schema}) "
               "yet: nothing stored so far")
    for command in ("sessions", "tasks", "facts", "usage"):
        code, out, err = await steward(home, command, cwd=tmp_path)
        assert (code, out, err) == (0, LISTINGS[command] + "\n", nothing + "\n"), command
    for command in NAMED:
        code, out, err = await steward(home, *command, cwd=tmp_path)
        assert (code, out) == (1, ""), (command, err)
        assert err == (nothing + " (the first `steward ask`, `chat`, `run` or `import` makes "
                       "it)\n"), command
    engine = create_async_engine(store_url.partition("?")[0])
    try:
        async with engine.connect() as conn:
            tables = (await conn.execute(text(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = :s"),
                {"s": schema})).scalars().all()
    finally:
        await engine.dispose()
    assert tables == []
    assert not (tmp_path / "out").exists()


async def test_config_may_name_the_directory_that_holds_config_toml(home, tmp_path):
    folder = tmp_path / "conf"
    folder.mkdir()
    (folder / "config.toml").write_text('[agent]\ntimezone = "Europe/Vienna"\n')
    code, out, err = await steward(home, "--config", str(folder), "db", "upgrade")
    assert code == 0, err
    (folder / "config.toml").write_text('[agent]\ntimezone = "Mars/Olympus"\n')
    code, _, err = await steward(home, "--config", str(folder), "tasks")
    assert code == 2
    assert err.strip() == (f"steward: {folder / 'config.toml'}: [agent] timezone: unknown "
                           "timezone 'Mars/Olympus'")
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = await steward(home, "--config", str(empty), "tasks")
    assert code == 2
    assert err.strip() == (f"steward: {empty}: no config.toml in this directory (from "
                           "--config)")
    code, _, err = await steward(home, "tasks", env=steward_env(home, STEWARD_CONFIG=str(empty)))
    assert err.strip() == (f"steward: {empty}: no config.toml in this directory (from "
                           "$STEWARD_CONFIG)")


def _interrupted_import(home, big) -> tuple[int, bytes]:
    """`steward import` on a terminal, Ctrl-C once its bar shows; (exit code, what the
    terminal got)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "bot", "import", str(big)], cwd=home,
                            env=steward_env(home), stdin=slave, stdout=slave, stderr=slave,
                            preexec_fn=interruptible)
    os.close(slave)
    shown = b""
    deadline = time.monotonic() + 120
    try:
        while b" new, " not in shown and time.monotonic() < deadline:  # the bar's counts
            shown += os.read(master, 65536)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other end closed: the process is gone
                break
            if not chunk:
                break
            shown += chunk
        return proc.wait(timeout=60), shown
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


async def test_ctrl_c_during_an_import_says_what_it_kept_and_that_again_is_safe(home):
    big = home / "big.jsonl"
    with big.open("w") as out:
        for n in range(300_000):  # minutes of work: Ctrl-C comes long before the end
            out.write(json.dumps({"session": f"imp:{n % 50}", "role": "user", "author": "ana",
                                  "text": f"message {n}", "ts": "2024-01-01T00:00:00Z",
                                  "ref": f"r{n}"}) + "\n")
    code, shown = await asyncio.to_thread(_interrupted_import, home, big)
    assert code == 130
    tail = ANSI.sub(b"", shown).decode().replace("\r", "\n").split("\n")
    last = [line for line in tail if line.strip()][-1]
    kept = re.fullmatch(r"steward: import interrupted: kept ([\d,]+) new entries of "
                        r"([\d,]+) messages read; running the same import again is safe "
                        r"\(it adds only what is missing\)", last)
    assert kept, last
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    try:
        stored = sum(c.last_seq for c in await store.list_conversations(limit=100))
    finally:
        await store.close()
    assert stored == int(kept.group(1).replace(",", "")) > 0
