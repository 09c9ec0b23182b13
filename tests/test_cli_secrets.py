"""Each command needs the secrets of what it uses, and no others; the secrets file that
`steward service install` writes (`<config dir>/steward/env`) is read by every command,
the environment winning over it. Real `steward` subprocesses, a real SQLite home, a fake
model server on 127.0.0.1."""

import asyncio
import os
import sys

import pytest

from tests.fakes.llm_server import FakeLLMServer
from tests.test_cli import steward, steward_env

# Slack and a mailbox switched on, none of their secrets set anywhere.
CONNECTED = """
[slack]
enabled = true
allowed_users = ["U012ABCDEF"]
[email]
enabled = true
address = "steward@example.org"
imap_host = "127.0.0.1"
smtp_host = "127.0.0.1"
smtp_user = "steward@example.org"
imap_password_env = "MAIL_PASSWORD"
smtp_password_env = "MAIL_PASSWORD"
"""


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def config_dir(home):
    path = home / "xdg" / "steward"
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_config(home, text: str) -> None:
    (config_dir(home) / "config.toml").write_text(text)


def write_secrets(home, text: str, mode: int = 0o600) -> None:
    path = config_dir(home) / "env"
    path.write_text(text)
    os.chmod(path, mode)


async def test_commands_that_use_no_connector_start_without_its_secrets(home):
    write_config(home, CONNECTED + '[llm]\nprovider = "scripted"\n')
    code, out, err = await steward(home, "ask", "hello there")
    assert code == 0 and out.strip(), err  # a terminal-only ask: no Slack, no mail
    for command in (["sessions"], ["log", "cli:default"], ["search", "hello"], ["usage"],
                    ["tasks"], ["schedules"], ["quarantine"], ["facts"],
                    ["context", "cli:default"], ["export", "--to", str(home / "out")]):
        code, out, err = await steward(home, *command)
        assert code == 0, (command, err)
        assert "SLACK" not in err and "MAIL_PASSWORD" not in err, (command, err)
    # `run` serves Slack and mail: it still refuses to start without their secrets
    code, _, err = await steward(home, "run")
    assert code == 2
    assert "SLACK_BOT_TOKEN is not set" in err and "MAIL_PASSWORD is not set" in err


async def test_web_starts_without_the_connectors_secrets(home):
    write_config(home, CONNECTED)
    await steward(home, "db", "upgrade")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "web", "--port", "0", env=steward_env(home), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert b"http://127.0.0.1:" in line, (line, await proc.stderr.read())
    finally:
        proc.terminate()
        await proc.wait()


async def test_a_command_that_uses_a_secret_still_names_the_one_it_lacks(home):
    write_config(home, '[llm]\nprovider = "openai"\nmodel = "m"\napi_key_env = "MY_KEY"\n')
    code, _, err = await steward(home, "ask", "hello")
    assert code == 2
    assert err.strip() == (f"steward: {config_dir(home) / 'config.toml'}: [llm] api_key_env: "
                           "environment variable MY_KEY is not set")
    code, out, err = await steward(home, "sessions")  # reads: no key needed
    assert (code, out) == (0, "no conversations yet\n"), err


async def test_the_service_secrets_file_is_read_and_the_environment_wins(home):
    with FakeLLMServer() as llm:
        write_config(home, f'[llm]\nprovider = "openai"\nbase_url = "{llm.url}/v1"\n'
                     'model = "m"\napi_key_env = "MY_KEY"\n')
        write_secrets(home, "# written by steward service install\nMY_KEY=from-the-file\n")
        code, out, err = await steward(home, "ask", "hello")
        assert code == 0, err
        assert llm.requests[-1].headers["authorization"] == "Bearer from-the-file"
        assert err == ""
        code, out, err = await steward(home, "ask", "again",
                                       env=steward_env(home, MY_KEY="from-the-shell"))
        assert code == 0, err
        assert llm.requests[-1].headers["authorization"] == "Bearer from-the-shell"


async def test_a_secrets_file_others_can_read_is_warned_about(home):
    write_config(home, '[llm]\nprovider = "scripted"\n')
    write_secrets(home, "SOMETHING=secret-value\n", mode=0o644)
    code, out, err = await steward(home, "db", "upgrade")
    assert code == 0
    secrets = config_dir(home) / "env"
    assert err.strip() == (f"steward: warning: {secrets} is readable by others (mode 0644); "
                           f"chmod 600 {secrets}")
    assert "secret-value" not in err
