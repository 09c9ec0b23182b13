"""Bad input at every `steward` command gets one line (`steward: ...`, or argparse's usage
and error lines), a non-zero exit and never a traceback. Real subprocesses, a temporary
home with a real SQLite file; a closed port stands in for a PostgreSQL server that is down.

Every command the parser knows is run with a broken config and with its PostgreSQL down,
so a command added later is covered without being listed here."""

import argparse
import asyncio
import json
import socket

import pytest
from sqlalchemy.engine import make_url

from bot.app.cli import _parser
from store import Writes, conversation_namespace, open_store
from tests.conftest import PG_URL
from tests.test_cli import steward, steward_env

SEMAPHORE = 2  # subprocesses at once (the machine has two cores)


def subcommands() -> list[str]:
    [action] = [a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(action.choices)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    conv = await store.ensure_conversation("cli:demo")
    for n in range(1, 4):
        w = Writes()
        w.append(conv.id, "user", f"message {n}", author="ana")
        w.edit_document(conversation_namespace(conv.id), "todo",
                        [{"op": "append", "path": ["items"], "value": f"item {n}"}],
                        initial={"items": []}, conversation_id=conv.id)
        await store.commit(w)
    await store.close()
    (home / "notes.txt").write_text("just some words\nnot JSON at all\n")
    (home / "good.jsonl").write_text(json.dumps({
        "session": "cli:old", "role": "user", "text": "hi", "ts": "2024-01-01T00:00:00Z"})
        + "\n")
    return home


def assert_one_line_error(result, code, needle=None):
    args, (got, out, err) = result
    shown = f"steward {' '.join(args)} -> {got}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in out + err, shown
    assert "unexpected error" not in err, shown  # every case here has its own message
    assert got == code, shown
    lines = err.strip().splitlines()
    if code == 2 and lines and lines[0].startswith("usage:"):  # argparse: usage + error
        assert lines[-1].startswith("steward") and ": error: " in lines[-1], shown
        assert all(line.startswith(("usage:", " ")) for line in lines[:-1]), shown
    else:
        assert len(lines) == 1 and lines[0].startswith("steward: "), shown
    if needle is not None:
        assert needle in lines[-1], shown


async def run_all(home, cases, **kw):
    gate = asyncio.Semaphore(SEMAPHORE)

    async def one(args):
        async with gate:
            return args, await steward(home, *args, **kw)

    return await asyncio.gather(*(one(args) for args, *_ in cases))


SPECIFIC = [
    (["ask", ""], 2, "nothing to ask: the message is empty"),
    (["ask", "  "], 2, "nothing to ask"),
    (["ask", "--session", "", "hi"], 2, "a session key cannot be empty"),
    (["chat", "--session", " "], 2, "a session key cannot be empty"),
    (["resume", "--now"], 2, "unrecognized arguments"),
    (["run", "extra"], 2, "unrecognized arguments"),
    (["db", "downgrade"], 2, "invalid choice"),
    (["context", "cli:nope"], 1, "no conversation 'cli:nope'"),
    (["compact", "cli:nope"], 1, "no conversation 'cli:nope'"),
    (["search", "roof", "--limit", "0"], 2, "must be 1 or more"),
    (["import", "nope.jsonl"], 1, "no such file"),
    (["import", "notes.txt", "--format", "jsonl"], 1, "is not a jsonl file"),
    (["import", "notes.txt", "--format", "mbox"], 1, "is not a mbox file"),
    (["import", "notes.txt"], 1, "cannot tell its format"),
    (["import", ".", "--format", "jsonl"], 1, "is a directory"),
    (["tasks", "--state", "asleep"], 2, "invalid choice"),
    (["tasks", "--limit", "-1"], 2, "must be 1 or more, not -1"),
    (["sessions", "--limit", "many"], 2, "not a whole number"),
    (["quarantine", "--limit", "0"], 2, "must be 1 or more"),
    (["schedules", "--limit", "-5"], 2, "must be 1 or more"),
    (["log", "cli:demo", "--limit", "-1"], 2, "must be 1 or more, not -1"),
    (["log", "cli:demo", "--before", "-1"], 2, "must be 0 or more"),
    (["log", "cli:nope"], 1, "no conversation 'cli:nope'"),
    (["fork", "cli:demo", "--as", "cli:demo"], 2,
     "a conversation 'cli:demo' already exists; name the fork with --as KEY"),
    (["fork", "cli:demo", "--at", "99"], 2, "cli:demo has 3 entries; --at 99 is past its end"),
    (["fork", "cli:demo", "--at", "-1"], 2, "must be 0 or more"),
    (["fork", "cli:nope"], 1, "no conversation 'cli:nope'"),
    (["doc", "cli:demo", "plans"], 1, "cli:demo has no document 'plans'"),
    (["doc", "cli:demo", "todo", "--as-of", "-1"], 2, "must be 0 or more"),
    (["doc", "cli:nope", "todo"], 1, "no conversation 'cli:nope'"),
    (["init"], 2, "init asks its questions on a terminal; without one, use --yes"),
    (["init", "--yes", "--provider", "pigeon"], 2, "invalid choice"),
    (["init", "--yes", "--email", "custom", "--email-address", "s@example.org"], 2,
     "email custom needs --imap-host and --smtp-host"),
    (["doctor", "--timeout", "0"], 2, "must be between 0 and 600 seconds, not 0"),
    (["doctor", "--timeout", "soon"], 2, "not a number of seconds"),
    (["service"], 2, "the following arguments are required: action"),
    (["service", "restart"], 2, "invalid choice"),
    (["restore"], 2, "the following arguments are required: backup"),
    (["restore", "nowhere"], 2, "restore needs --home DIR"),
    (["restore", "nowhere", "--home", "."], 1, "is not empty: a backup is restored into a "
     "new home only"),
    (["forget"], 2, "one of the arguments --session --person is required"),
    (["forget", "--session", "cli:demo", "--person", "ana"], 2, "not allowed with argument"),
    (["forget", "--session", "cli:nope", "--dry-run"], 1, "no conversation 'cli:nope'"),
    (["forget", "--session", " ", "--yes"], 2, "--session needs a conversation key"),
    (["--limit", "3"], 2, None),
    (["sessions", "--no-such-option"], 2, "unrecognized arguments"),
]


async def test_each_command_refuses_bad_input_in_one_line(home):
    assert {args[0] for args, *_ in SPECIFIC if not args[0].startswith("-")} >= {
        "ask", "chat", "resume", "run", "db", "context", "compact", "search", "import",
        "tasks", "sessions", "quarantine", "schedules", "log", "fork", "doc", "init",
        "doctor", "service"}
    results = await run_all(home, SPECIFIC)
    for result, (_args, code, needle) in zip(results, SPECIFIC, strict=True):
        assert_one_line_error(result, code, needle)
    # nothing was changed by any of them: no fork, no import, no turn
    code, out, _ = await steward(home, "sessions", "--json")
    assert [json.loads(line)["key"] for line in out.splitlines()] == ["cli:demo"]


async def test_every_command_with_a_broken_config(home):
    commands = [c for c in subcommands() if c not in NO_CONFIG]
    (home / "config.toml").write_text("[agent]\nwishes = 3\n")
    cases = [([c, *ARGS.get(c, [])], 2, f"{home / 'config.toml'}: [agent] wishes: unknown key")
             for c in commands]
    results = await run_all(home, cases)
    for result, (_args, code, needle) in zip(results, cases, strict=True):
        assert_one_line_error(result, code, needle)


# what each command needs to get as far as opening the store (unknown commands: nothing)
ARGS = {"ask": ["hello"], "context": ["cli:demo"], "compact": ["cli:demo"],
        "search": ["roof"], "import": ["good.jsonl"], "log": ["cli:demo"],
        "fork": ["cli:demo"], "doc": ["cli:demo", "todo"], "db": ["upgrade"],
        "init": ["--yes"], "service": ["install", "--print"],
        "forget": ["--person", "ana", "--dry-run"]}
# Commands that never open the store: `init` writes the config (here it refuses to replace
# the one that exists) and `service` installs what will run Steward. Their bad input is in
# SPECIFIC and tests/test_init.py, tests/test_service.py.
NO_STORE = {"init", "service", "restore"}
# `restore` reads no config at all: it makes a new home from a backup (its own checks are
# in SPECIFIC and tests/test_restore.py).
NO_CONFIG = {"restore"}


async def test_every_command_with_postgresql_down(home):
    commands = [c for c in subcommands() if c not in NO_STORE]
    assert "doctor" in commands  # its failed database row is the same line
    port = closed_port()
    (home / "config.toml").write_text(
        f'[store]\nurl = "postgresql+asyncpg://postgres@127.0.0.1:{port}/test"\n')
    cases = [([c, *ARGS.get(c, [])], 1,
              f"cannot reach PostgreSQL at 127.0.0.1:{port} (database 'test', from [store] "
              f"url in {home / 'config.toml'})") for c in commands]
    results = await run_all(home, cases)
    for result, (_args, code, needle) in zip(results, cases, strict=True):
        assert_one_line_error(result, code, needle)


async def test_a_database_postgresql_refuses_is_one_line_naming_it(home):
    url = make_url(PG_URL).set(database="no_such_database").render_as_string(False)
    (home / "config.toml").write_text(f'[store]\nurl = "{url}"\n')
    [result] = await run_all(home, [(["tasks"],)])
    assert_one_line_error(result, 1, 'database "no_such_database" does not exist')


async def test_a_tool_module_that_cannot_be_imported_names_the_config_file(home):
    (home / "config.toml").write_text('[agent]\ntool_modules = ["no_such_tools.here"]\n')
    for args in (["ask", "hello"], ["context", "cli:demo"]):
        [result] = await run_all(home, [(args,)])
        assert_one_line_error(
            result, 2, f"steward: {home / 'config.toml'}: [agent] tool_modules: cannot import "
            "tool module 'no_such_tools.here': ModuleNotFoundError")


async def test_a_home_that_is_a_file_or_cannot_be_created(home, tmp_path):
    a_file = tmp_path / "plain-file"
    a_file.write_text("")
    cases = [([c, *ARGS.get(c, []), "--home", str(a_file)], 2,
              f"home {a_file} (from --home) is not a directory")
             for c in ("ask", "import", "run", "search", "db", "tasks")]
    results = await run_all(home, cases)
    for result, (_args, code, needle) in zip(results, cases, strict=True):
        assert_one_line_error(result, code, needle)
    env = steward_env(a_file / "inside")
    code, out, err = await steward(home, "tasks", env=env)
    assert (code, err.strip()) == (
        2, f"steward: home {a_file / 'inside'} (from $STEWARD_HOME): {a_file} is not a "
        "directory")


async def test_steward_debug_shows_the_traceback(home):
    code, _, err = await steward(home, "log", "cli:nope",
                                 env=steward_env(home, STEWARD_DEBUG="1"))
    assert code == 1 and "Traceback" in err and "NotFound: no conversation 'cli:nope'" in err
