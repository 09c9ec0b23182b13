"""The config as last validated (bot/app/config_snapshot.py): the reading commands use it
only while everything it was validated from is unchanged, and a change of any kind falls
back to the full load, errors and all."""

import json
import os
from pathlib import Path

import pytest

from bot.app.cli import main
from bot.app.config import load_config, load_found
from bot.app.config_snapshot import NAME, Snapshot, recall
from bot.config_source import locate


@pytest.fixture
def place(tmp_path: Path, monkeypatch):
    """A home that exists, a config file in the working directory, an empty environment."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir(mode=0o700)
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    env = {"HOME": str(tmp_path / "user"), "STEWARD_HOME": str(home)}
    for key in [k for k in os.environ if k.startswith(("STEWARD_", "XDG_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("STEWARD_HOME", str(home))
    monkeypatch.setenv("HOME", env["HOME"])
    return home, cwd, env


def found(cwd: Path, env: dict):
    return locate(None, None, env, cwd)


def write_config(cwd: Path, text: str) -> None:
    (cwd / "config.toml").write_text(text, encoding="utf-8")


def test_a_full_load_is_remembered_and_read_back_as_it_validated(place):
    home, cwd, env = place
    write_config(cwd, '[agent]\ntimezone = "Europe/Paris"\n[embeddings]\nbatch_size = 8\n')
    full = load_config(None, None, env, cwd)
    snapshot = recall(found(cwd, env), env)
    assert isinstance(snapshot, Snapshot)
    assert (snapshot.home, snapshot.path, snapshot.store_url) == (full.home, full.path,
                                                                   full.store_url)
    assert snapshot.agent.timezone == "Europe/Paris"
    assert snapshot.embeddings.batch_size == 8 and snapshot.embeddings.depth == 50  # default
    assert (home / NAME).stat().st_mode & 0o777 == 0o600


def test_a_home_that_does_not_exist_is_not_created_for_it(tmp_path):
    env = {"HOME": str(tmp_path), "STEWARD_HOME": str(tmp_path / "none")}
    load_config(None, None, env, tmp_path)
    assert not (tmp_path / "none").exists()


def test_secrets_are_named_never_stored_and_must_still_be_set(place):
    _, cwd, env = place
    write_config(cwd, '[llm]\nprovider = "openai"\nmodel = "m"\napi_key_env = "KEY_X"\n')
    env = {**env, "KEY_X": "sk-very-secret-value"}
    load_config(None, None, env, cwd)
    assert "sk-very-secret-value" not in (Path(env["STEWARD_HOME"]) / NAME).read_text()
    assert recall(found(cwd, env), env).secret("KEY_X") == "sk-very-secret-value"
    unset = {k: v for k, v in env.items() if k != "KEY_X"}
    assert recall(found(cwd, unset), unset) is None


def test_an_edited_file_another_home_or_another_file_is_not_the_snapshot(place, tmp_path):
    home, cwd, env = place
    write_config(cwd, "[agent]\nmax_tool_rounds = 3\n")
    load_config(None, None, env, cwd)
    assert recall(found(cwd, env), env) is not None
    write_config(cwd, "[agent]\nmax_tool_rounds = 4\n")
    assert recall(found(cwd, env), env) is None
    write_config(cwd, "[agent]\nmax_tool_rounds = 3\n")
    assert recall(found(cwd, env), env) is not None  # the same bytes again
    elsewhere = tmp_path / "elsewhere.toml"
    elsewhere.write_text("[agent]\nmax_tool_rounds = 3\n")
    assert recall(locate(str(elsewhere), None, env, cwd), env) is None
    other_home = tmp_path / "other"
    (home / NAME).rename(other_home.with_suffix(".json"))
    other_home.mkdir()
    other_home.with_suffix(".json").rename(other_home / NAME)
    assert recall(locate(None, str(other_home), env, cwd), env) is None


def test_code_changed_since_is_not_the_snapshot(place, tmp_path):
    home, cwd, env = place
    write_config(cwd, "")
    load_found(found(cwd, env), env)
    snapshot = json.loads((home / NAME).read_text())
    assert any(c[0].endswith(os.path.join("bot", "config.py")) for c in snapshot["code"])
    module = tmp_path / "validator.py"
    module.write_text("x = 1\n")
    st = module.stat()
    snapshot["code"].append([str(module), st.st_mtime_ns, st.st_size])
    (home / NAME).write_text(json.dumps(snapshot))
    assert recall(found(cwd, env), env) is not None
    module.write_text("x = 22\n")
    assert recall(found(cwd, env), env) is None


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format": 1}', "\x00\xff"])
def test_a_damaged_snapshot_is_ignored(place, text):
    home, cwd, env = place
    write_config(cwd, "")
    (home / NAME).write_text(text, encoding="utf-8", errors="surrogateescape")
    assert recall(found(cwd, env), env) is None


@pytest.fixture
def umask_kept():
    """`main` sets this process's umask to 0o077, as the CLI does for its own process; the
    rest of the test session (a Dovecot's passwd file) must not inherit it."""
    old = os.umask(0o077)
    os.umask(old)
    yield
    os.umask(old)


def test_a_reading_command_reports_a_config_broken_since_it_was_remembered(
        place, capsys, umask_kept):
    home, cwd, _ = place
    write_config(cwd, '[agent]\ntimezone = "UTC"\n')
    assert main(["sessions"]) == 0
    assert (home / NAME).is_file()
    write_config(cwd, '[agent]\ntimezone = "Mars/Olympus"\n')
    capsys.readouterr()
    assert main(["sessions"]) == 2
    assert "unknown timezone 'Mars/Olympus'" in capsys.readouterr().err
