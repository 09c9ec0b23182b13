"""`steward init` as a person runs it: real subprocesses, on a real terminal (a pty) for the
questions and with `--yes` and flags without one. What it writes loads with the config
loader Steward starts with, holds no secret, and is never written over unasked."""

import asyncio
import json
import os
import select
import stat
import subprocess
import sys
import time
import tomllib

import pytest

from bot.app import cli, presets
from bot.app.config import load_config
from bot.app.slack_manifest import bot_scopes, manifest
from tests.fakes.llm_server import FakeLLMServer
from tests.test_cli import steward, steward_env
from tests.test_cli_errors import assert_one_line_error

SECRETS = {"OPENAI_API_KEY": "sk-secret-openai-1234", "SLACK_BOT_TOKEN": "xoxb-secret-5678",
           "SLACK_APP_TOKEN": "xapp-secret-9012", "SLACK_SIGNING_SECRET": "sig-secret-3456",
           "STEWARD_EMAIL_PASSWORD": "mail-secret-7890", "ANTHROPIC_API_KEY": "sk-ant-secret"}


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def written(home):
    return home / "xdg" / "steward" / "config.toml"  # steward_env's XDG_CONFIG_HOME


def loads(path, **env):
    """The file as `steward run` reads it, with these secrets in the environment."""
    return load_config(str(path), None, {"HOME": str(path.parent), **env}, path.parent)


def no_ollama() -> str:
    return "http://127.0.0.1:9"  # the discard port: nothing answers


async def test_yes_with_flags_writes_a_config_that_loads_and_holds_no_secret(home):
    env = steward_env(home, **SECRETS)
    code, out, err = await steward(
        home, "init", "--yes", "--ollama-url", no_ollama(), "--timezone", "Europe/Vienna",
        "--slack", "socket", "--slack-users", "U0ANN, U0BOB", "--email", "fastmail",
        "--email-address", "steward@fastmail.com", "--email-senders", "ann@example.com,@ex.org",
        env=env)
    assert code == 0, err
    path = written(home)
    assert f"wrote {path}" in out
    text = path.read_text()
    for value in SECRETS.values():
        assert value not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    config = loads(path, **SECRETS)
    assert (config.llm.provider, config.llm.model, config.llm.api_key_env) == (
        "openai", "gpt-4o-mini", "OPENAI_API_KEY")  # the key found in the environment
    assert config.agent.timezone == "Europe/Vienna"
    assert (config.slack.enabled, config.slack.mode, config.slack.allowed_users) == (
        True, "socket", ["U0ANN", "U0BOB"])
    fastmail = presets.EMAIL_PRESETS["fastmail"]
    email = config.email
    assert (email.imap_host, email.imap_port, email.imap_security) == fastmail.imap
    assert (email.smtp_host, email.smtp_port, email.smtp_security) == fastmail.smtp
    assert email.sent_mailbox == fastmail.sent_mailbox
    assert (email.address, email.imap_user, email.smtp_user) == ("steward@fastmail.com",) * 3
    assert email.imap_password_env == email.smtp_password_env == "STEWARD_EMAIL_PASSWORD"
    assert email.allowed_senders == ["ann@example.com", "@ex.org"]
    # the Slack app manifest was printed, for Socket Mode, and the variables to set named
    assert "socket_mode_enabled: true" in out and "request_url:" not in out.replace(
        "# request_url:", "")
    assert "SLACK_BOT_TOKEN (not set now)" not in out  # it is set in this environment


async def test_it_refuses_to_overwrite_unless_forced(home):
    env = steward_env(home)
    args = ["init", "--yes", "--ollama-url", no_ollama(), "--provider", "demo"]
    assert (await steward(home, *args, env=env))[0] == 0
    before = written(home).read_text()
    result = await steward(home, *args, "--provider", "anthropic", env=env)
    assert_one_line_error((args, result), 2, f"{written(home)} already exists")
    assert "--force replaces it" in result[2]
    assert written(home).read_text() == before
    code, _, err = await steward(home, *args, "--provider", "anthropic", "--force", env=env)
    assert code == 0, err
    assert loads(written(home), ANTHROPIC_API_KEY="k").llm.provider == "anthropic"


async def test_an_existing_broken_config_is_named_not_overwritten(home):
    (home / "config.toml").write_text("[llm]\nprovider = 'carrier-pigeon'\n")
    result = await steward(home, "init", "--yes", "--ollama-url", no_ollama())
    assert_one_line_error((["init"], result), 2,
                          f"{home / 'config.toml'}: [llm] provider: Input should be")
    assert "--force` writes a new one" in result[2]
    assert (home / "config.toml").read_text() == "[llm]\nprovider = 'carrier-pigeon'\n"


async def test_a_local_ollama_is_found_and_offered_first(home):
    with FakeLLMServer() as server:
        server.tags = ["qwen2.5:7b", "llama3.2:3b"]
        url = server.url
        code, out, err = await steward(home, "init", "--yes", "--ollama-url", url)
    assert code == 0, err
    config = loads(written(home))
    assert (config.llm.provider, config.llm.base_url, config.llm.model) == (
        "ollama", f"{url}/v1", "qwen2.5:7b")
    assert not config.llm.api_key_env  # a local Ollama needs no key
    assert [r.path for r in server.requests] == ["/api/tags"]


async def test_nothing_detected_leaves_the_choice_to_each_start(home):
    code, out, err = await steward(home, "init", "--yes", "--ollama-url", no_ollama(),
                                   "--llamacpp-url", no_ollama(), "--print")
    assert code == 0, err
    assert not written(home).exists()
    data = tomllib.loads(out)
    assert data["llm"] == {}  # no provider: detected at each start, the demo model else
    assert "agent" in data


async def test_slack_http_mode_prints_the_manifest_for_its_url(home):
    import yaml

    url = "https://steward.example.org/slack/events"
    code, out, err = await steward(home, "init", "--yes", "--ollama-url", no_ollama(),
                                   "--slack", "http", "--slack-url", url, "--slack-users",
                                   "U0ANN", env=steward_env(home, **SECRETS))
    assert code == 0, err
    start = out.index("display_information:")
    app = yaml.safe_load(out[start:out.index("\nThen install it")])
    assert app["settings"]["socket_mode_enabled"] is False
    assert app["settings"]["event_subscriptions"]["request_url"] == url
    assert app["settings"]["interactivity"]["request_url"] == url
    assert app["oauth_config"]["scopes"]["bot"] == bot_scopes()
    config = loads(written(home), **SECRETS)
    assert (config.slack.mode, config.slack.signing_secret_env) == (
        "http", "SLACK_SIGNING_SECRET")


def test_the_manifest_file_reads_the_same_in_both_modes():
    import yaml

    socket = yaml.safe_load(manifest("socket"))
    http = yaml.safe_load(manifest("http", "https://h/slack/events"))
    assert socket["settings"]["socket_mode_enabled"] is True
    assert "request_url" not in socket["settings"]["event_subscriptions"]
    assert socket["oauth_config"] == http["oauth_config"]
    assert "chat:write" in bot_scopes() and len(bot_scopes()) == len(set(bot_scopes())) >= 8
    assert socket["settings"]["event_subscriptions"]["bot_events"] == \
        http["settings"]["event_subscriptions"]["bot_events"]


async def test_bad_input_is_one_line(home):
    cases = [
        (["init"], 2, "init asks its questions on a terminal; without one, use --yes"),
        (["init", "--yes", "--provider", "ollama", "--ollama-url", no_ollama()], 2,
         f"no Ollama answered at {no_ollama()}"),
        (["init", "--yes", "--provider", "compatible", "--ollama-url", no_ollama()], 2,
         "provider compatible needs --base-url"),
        (["init", "--yes", "--email", "gmail", "--ollama-url", no_ollama()], 2,
         "email needs --email-address"),
        (["init", "--yes", "--email", "custom", "--email-address", "s@x.org",
          "--ollama-url", no_ollama()], 2, "email custom needs --imap-host and --smtp-host"),
        (["init", "--yes", "--timezone", "Mars/Olympus", "--ollama-url", no_ollama()], 2,
         "[agent] timezone: unknown timezone 'Mars/Olympus'"),
        (["init", "--yes", "--slack", "carrier"], 2, "invalid choice"),
    ]
    for args, code, needle in cases:
        result = await steward(home, *args)
        assert_one_line_error((args, result), code, needle)
    assert not written(home).exists()


async def test_config_may_name_the_directory_to_write_config_toml_into(home):
    folder = home / "conf"
    folder.mkdir()
    code, out, err = await steward(home, "init", "--yes", "--ollama-url", no_ollama(),
                                   "--config", str(folder))
    assert code == 0, err
    assert f"wrote {folder / 'config.toml'}" in out
    assert loads(folder / "config.toml").path == folder / "config.toml"
    odd = home / "odd"
    (odd / "config.toml").mkdir(parents=True)  # what it would write is a directory
    args = ["init", "--yes", "--config", str(odd)]
    assert_one_line_error((args, await steward(home, *args)), 2,
                          f"{odd / 'config.toml'} is a directory")


def test_the_parser_offers_the_presets_it_knows():
    assert cli.PROVIDERS == tuple(presets.PROVIDERS)
    assert cli.EMAIL_PRESETS == tuple(presets.EMAIL_PRESETS)


# -- on a terminal -------------------------------------------------------------------------


class Terminal:
    """`steward init` on a pseudo-terminal: wait for a question, type an answer."""

    def __init__(self, home, *args, env):
        self.master, slave = os.openpty()
        self.proc = subprocess.Popen([sys.executable, "-m", "bot", "init", *args], cwd=home,
                                     env=env, stdin=slave, stdout=slave, stderr=slave)
        os.close(slave)
        self.screen = ""  # not yet answered
        self.transcript = ""  # all of it

    def answer(self, question: str, text: str) -> None:
        self.wait(question)
        os.write(self.master, text.encode() + b"\r")

    def wait(self, question: str, seconds: float = 20.0) -> None:
        deadline = time.monotonic() + seconds
        while question not in self.screen:
            left = deadline - time.monotonic()
            assert left > 0, f"no {question!r} on the screen:\n{self.screen}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.master, 4096).decode(errors="replace")
                except OSError:  # the other end closed: the program ended
                    chunk = ""
                assert chunk, f"init ended before {question!r}:\n{self.screen}"
                self.screen += chunk
                self.transcript += chunk
        self.screen = self.screen[self.screen.index(question) + len(question):]

    def finish(self, seconds: float = 20.0) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            try:
                chunk = os.read(self.master, 4096).decode(errors="replace") if ready else ""
            except OSError:
                chunk = ""
            self.transcript += chunk
            if self.proc.poll() is not None and not chunk:
                break
        os.close(self.master)
        return self.proc.wait(5)


async def test_on_a_terminal_it_asks_and_defaults_are_one_key_away(home):
    env = steward_env(home, ANTHROPIC_API_KEY=SECRETS["ANTHROPIC_API_KEY"])

    def session():
        term = Terminal(home, "--ollama-url", no_ollama(), env=env)
        term.answer("choose [anthropic]", "")  # the key in the environment is offered first
        term.answer("Model [claude-sonnet-4-5]", "")
        term.answer("Variable holding the API key [ANTHROPIC_API_KEY]", "")
        term.answer("Your timezone", "Europe/Lisbon")
        term.wait("Connect Slack?")
        term.answer("choose [off]", "slack")  # not a choice: asked again
        term.wait("one of: off, socket, http")
        term.answer("choose [off]", "http")
        term.answer("Public URL Slack will post to", "https://s.example.org/slack/events")
        term.answer("Variable for the bot token [SLACK_BOT_TOKEN]", "MY_BOT_TOKEN")
        term.answer("Variable for the signing secret [SLACK_SIGNING_SECRET]", "")
        term.answer("Copy member ID), comma-separated", "U0ANN")
        term.wait("Connect a mailbox of Steward's own?")
        term.answer("choose [off]", "icloud")
        term.answer("Steward's email address", "steward@icloud.com")
        term.answer("Login [steward@icloud.com]", "")
        term.answer("Variable holding the password [STEWARD_EMAIL_PASSWORD]", "ICLOUD_PW")
        term.answer("comma-separated", "ann@example.com")
        return term.finish(), term.transcript

    code, screen = await asyncio.to_thread(session)
    assert code == 0, screen
    assert "request_url: https://s.example.org/slack/events" in screen
    assert "Traceback" not in screen
    config = loads(written(home), ANTHROPIC_API_KEY="k", MY_BOT_TOKEN="b",
                   SLACK_SIGNING_SECRET="s", ICLOUD_PW="p")
    assert (config.llm.provider, config.llm.model) == ("anthropic", "claude-sonnet-4-5")
    assert config.agent.timezone == "Europe/Lisbon"
    assert (config.slack.mode, config.slack.bot_token_env, config.slack.allowed_users) == (
        "http", "MY_BOT_TOKEN", ["U0ANN"])
    icloud = presets.EMAIL_PRESETS["icloud"]
    assert (config.email.smtp_host, config.email.smtp_port) == icloud.smtp[:2]
    assert config.email.imap_password_env == "ICLOUD_PW"
    assert config.email.allowed_senders == ["ann@example.com"]
    assert SECRETS["ANTHROPIC_API_KEY"] not in written(home).read_text()


async def test_a_name_for_a_member_id_or_a_mailbox_that_is_no_address_is_asked_again(home):
    env = steward_env(home)

    def session():
        term = Terminal(home, "--provider", "openai", "--model", "m", "--api-key-env", "K",
                        "--timezone", "UTC", "--slack", "socket", "--email", "fastmail",
                        env=env)
        term.answer("Variable for the bot token [SLACK_BOT_TOKEN]", "")
        term.answer("Variable for the app token [SLACK_APP_TOKEN]", "")
        term.answer("Copy member ID), comma-separated", "U0ANN, bob")
        term.wait("'bob' is not a Slack member id")
        term.answer("Copy member ID), comma-separated", "U0ANN, W0BOB")
        term.answer("Steward's email address", "not-an-email")
        term.wait("'not-an-email' is not an email address")
        term.answer("Steward's email address", "steward@fastmail.com")
        term.answer("Login [steward@fastmail.com]", "")
        term.answer("Variable holding the password [STEWARD_EMAIL_PASSWORD]", "")
        term.answer("comma-separated", "ann")
        term.wait("'ann' is neither an email address nor @domain")
        term.answer("comma-separated", "ann@example.com, @example.org")
        return term.finish(), term.transcript

    code, screen = await asyncio.to_thread(session)
    assert code == 0, screen
    config = loads(written(home), K="k", SLACK_BOT_TOKEN="b", SLACK_APP_TOKEN="a",
                   STEWARD_EMAIL_PASSWORD="p")
    assert config.slack.allowed_users == ["U0ANN", "W0BOB"]
    assert config.email.address == "steward@fastmail.com"
    assert config.email.allowed_senders == ["ann@example.com", "@example.org"]


async def test_with_yes_a_bad_member_id_or_address_is_one_line(home):
    quiet = ["init", "--yes", "--provider", "openai", "--model", "m", "--timezone", "UTC"]
    cases = [
        ([*quiet, "--slack", "socket", "--slack-users", "U0ANN,bob"],
         "--slack-users: 'bob' is not a Slack member id"),
        ([*quiet, "--email", "fastmail", "--email-address", "not-an-email"],
         "--email-address: 'not-an-email' is not an email address"),
        ([*quiet, "--email", "fastmail", "--email-address", "s@fastmail.com",
          "--email-senders", "ann"], "--email-senders: 'ann' is neither an email address "
                                     "nor @domain"),
    ]
    for args, needle in cases:
        assert_one_line_error((args, await steward(home, *args)), 2, needle)
    assert not written(home).exists()


async def test_the_secrets_go_in_one_file_that_doctor_and_the_service_read(home):
    args = ["init", "--yes", "--provider", "openai", "--model", "m", "--api-key-env",
            "MY_KEY", "--timezone", "UTC", "--slack", "socket", "--slack-users", "U0ANN"]
    code, out, err = await steward(home, *args)
    assert code == 0, err
    secrets = home / "xdg" / "steward" / "env"
    assert f"put them in {secrets} (made now, 0600: fill in the values)" in out
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    body = secrets.read_text()
    assert all(f"#{name}=" in body for name in ("MY_KEY", "SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"))
    secrets.write_text("MY_KEY=k-1\nSLACK_BOT_TOKEN=xoxb-1\nSLACK_APP_TOKEN=xapp-1\n")
    code, out, err = await steward(home, "doctor", "--json", "--timeout", "1")
    rows = {r["check"]: r for r in map(json.loads, out.splitlines())}
    assert rows["secrets"]["status"] == "ok", rows["secrets"]
    assert rows["secrets"]["detail"] == "set: MY_KEY, SLACK_BOT_TOKEN, SLACK_APP_TOKEN"
