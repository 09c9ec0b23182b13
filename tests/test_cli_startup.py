"""`steward --help`, `--version` and a mistyped command answer from the parser alone: no
database, model, Slack or migration code is imported for them (start-up time is what a
person waits for at every command)."""

import asyncio
import os
import subprocess
import sys

from alembic.script import ScriptDirectory

import store
from bot.app.cli import TASK_STATES
from store import open_store
from store.engine import MIGRATIONS, create_engines, migrate
from store.revision import HEAD, at_head, current

HEAVY = ("sqlalchemy", "alembic", "aiohttp", "slack_sdk", "slack_bolt", "httpx", "pydantic",
         "bot.app.commands", "store")


def imported_by(*argv: str) -> set[str]:
    probe = ("import sys\nfrom bot.app.cli import main\n"
             f"try:\n    main({list(argv)!r})\nexcept SystemExit:\n    pass\n"
             "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return set(out.split()[-1000:]) if out else set()


def test_help_version_and_a_wrong_command_import_nothing_heavy():
    for argv in (["--help"], ["--version"], ["no-such-command"], ["log", "--help"],
                 ["init", "--help"], ["doctor", "--help"], ["service", "--help"]):
        loaded = imported_by(*argv)
        assert "argparse" in loaded, argv
        loaded.discard("httpx._main")  # bot.app.cli's marker that keeps httpx's own CLI out
        assert not {m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY}, argv


def test_the_parser_knows_the_stores_task_states():
    assert TASK_STATES == store.STATES


# -- the commands people run most: no agent, no model client, no Slack, no Alembic ----------

LIGHT = ("sessions", "log cli:x", "search hello", "tasks", "schedules --all", "quarantine",
         "usage")
# On SQLite at the current schema they read through the standard library (store/reader.py),
# and once a command has validated the config, they use what it found
# (bot/app/config_snapshot.py).
NOT_FOR_READING = ("pydantic", "sqlalchemy", "aiosqlite", "store.store", "bot.runtime",
                   "alembic", "aiohttp", "slack_sdk", "slack_bolt", "mcp", "aioimaplib",
                   "aiosmtplib", "apscheduler", "bot.llm.openai", "bot.llm.anthropic",
                   "bot.app.wiring", "bot.agent.turn", "connectors.slack.connector")


def imported_running(home, argv: list[str]) -> tuple[int, set[str]]:
    probe = ("import sys\nfrom bot.app.cli import main\n"
             f"code = main({argv!r})\n"
             "print(code, ' '.join(sorted(sys.modules)))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEWARD_", "XDG_"))}
    env.update(STEWARD_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=home, env=env)
    last = done.stdout.strip().splitlines()[-1]
    code, _, names = last.partition(" ")
    return int(code), set(names.split())


async def test_reading_commands_on_a_current_database_load_no_heavy_code(tmp_path):
    home = tmp_path / "home"
    s = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    await s.ensure_conversation("cli:x")
    await s.close()
    code, loaded = await asyncio.to_thread(imported_running, home, ["sessions"])
    assert code == 0 and "pydantic" in loaded  # the first validates the config in full
    for command in LIGHT:
        code, loaded = await asyncio.to_thread(imported_running, home, command.split())
        assert code == 0, command
        heavy = {m for m in loaded if m in NOT_FOR_READING
                 or m.split(".")[0] in NOT_FOR_READING}
        assert not heavy, (command, sorted(heavy))


async def test_every_reading_command_runs_on_the_config_as_last_validated(tmp_path):
    """Every reading command skips the validator once the config is remembered
    (bot/app/config_snapshot.py), and reads what it needs of it."""
    home = tmp_path / "home"
    s = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    await s.ensure_conversation("cli:x")
    await s.close()
    await asyncio.to_thread(imported_running, home, ["sessions"])
    for argv in (["tasks"], ["schedules", "--all"], ["quarantine"], ["usage"],
                 ["doc", "cli:x", "todo"], ["search", "hello", "--session", "cli:x"]):
        code, loaded = await asyncio.to_thread(imported_running, home, argv)
        assert code == (1 if argv[0] == "doc" else 0), argv  # (no such document: one line)
        assert "pydantic" not in loaded, argv


async def test_a_reading_command_that_fails_says_so_without_loading_heavy_code(tmp_path):
    """Explaining the error must not cost what the command saved: `log` of a conversation
    that does not exist took 1.4 s, importing the agent's tools (and SQLAlchemy with them)
    to ask whether the error was one of theirs."""
    home = tmp_path / "home"
    s = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    await s.close()
    await asyncio.to_thread(imported_running, home, ["sessions"])
    code, loaded = await asyncio.to_thread(imported_running, home, ["log", "cli:missing"])
    assert code == 1
    heavy = {m for m in loaded if m in NOT_FOR_READING or m.split(".")[0] in NOT_FOR_READING}
    assert not heavy, sorted(heavy)


async def test_a_database_behind_is_migrated_by_any_command(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    engines = create_engines(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    older = ScriptDirectory.from_config(_alembic_config()).get_revision(HEAD).down_revision
    await migrate(engines, older)
    assert await current(engines) == older
    code, _ = await asyncio.to_thread(imported_running, home, ["sessions"])
    assert code == 0
    assert await at_head(engines)
    await engines.dispose()


def _alembic_config():
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def test_the_head_revision_written_down_is_alembics():
    """store/revision.py names the newest migration without loading Alembic; a migration
    added without updating it fails here (and every start would run Alembic)."""
    assert ScriptDirectory.from_config(_alembic_config()).get_heads() == [HEAD]
