"""`steward doctor` against real local servers: the fake model provider and the fake Slack
Web API over HTTP on 127.0.0.1, Dovecot for IMAP, aiosmtpd for SMTP, a real SQLite file
and the PostgreSQL server. Every failure is a row with a fix, never a traceback, and a
server that never answers costs one time limit, not a hang."""

import asyncio
import json
import os
import sqlite3
import time
from email.utils import formatdate

import pytest
from aiosmtpd.smtp import SMTP as SMTPServer
from aiosmtpd.smtp import AuthResult

from bot.app.slack_manifest import bot_scopes
from store import open_store
from tests.fakes.llm_server import FakeLLMServer, Reply, replies
from tests.fakes.mail_servers import SmtpSink, account_fixture, dovecot_fixture  # noqa: F401
from tests.fakes.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack
from tests.test_cli import steward, steward_env
from tests.test_cli_errors import closed_port

LLM_KEY = "sk-doctor-test"
SMTP_PASSWORD = "smtp-doctor-password"


class ScopedSlack(FakeSlack):
    """The fake Slack, saying which scopes the token has as Slack does: an
    `x-oauth-scopes` header on every Web API answer."""

    scopes = bot_scopes()

    def _answer(self, method, params, token):
        status, headers, body, down = super()._answer(method, params, token)
        return status, {**headers, "x-oauth-scopes": ",".join(self.scopes)}, body, down


def _login(server, session, envelope, mechanism, auth_data):
    return AuthResult(success=auth_data.password == SMTP_PASSWORD.encode(), handled=False)


class AuthSMTP(SMTPServer):
    def __init__(self, handler, **kw):
        super().__init__(handler, authenticator=_login, auth_require_tls=False, **kw)


class Silent:
    """A TCP server on 127.0.0.1 that takes connections and never says a word."""

    async def start(self):
        self.held = []

        async def hold(reader, writer):
            self.held.append(writer)
            await reader.read()  # until the client gives up

        self.server = await asyncio.start_server(hold, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self):
        for writer in self.held:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


class Canned:
    """An HTTP server on 127.0.0.1 answering every request with one JSON body and the
    given headers (a Date header of its choosing: a server whose clock is off)."""

    def __init__(self, body: dict, headers: dict):
        self.body, self.headers = json.dumps(body).encode(), headers

    async def start(self):
        async def answer(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            lines = ["HTTP/1.1 200 OK", "Content-Type: application/json",
                     f"Content-Length: {len(self.body)}", "Connection: close",
                     *(f"{k}: {v}" for k, v in self.headers.items())]
            writer.write("\r\n".join(lines).encode() + b"\r\n\r\n" + self.body)
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self):
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


@pytest.fixture
def model():
    with FakeLLMServer() as server:
        yield server


@pytest.fixture
def slack():
    with ScopedSlack() as fake:
        yield fake


@pytest.fixture
async def smtp():
    sink = SmtpSink()
    sink.server_class = AuthSMTP
    await sink.start()
    yield sink
    await sink.stop()


def write_config(home, *, model_url=None, slack_url=None, imap_port=None, smtp_port=None,
                 user="nobody", store_url=None, **email):
    lines = []
    if store_url:
        lines += ["[store]", f'url = "{store_url}"']
    if model_url:
        lines += ["[llm]", 'provider = "openai"', f'base_url = "{model_url}/v1"',
                  'model = "fake-model"', 'api_key_env = "TEST_LLM_KEY"']
    if slack_url:
        lines += ["[slack]", "enabled = true", f'api_base_url = "{slack_url}"',
                  'allowed_users = ["U0ANN"]']
    if imap_port:
        settings = {"enabled": True, "address": "steward@example.com",
                    "imap_host": "127.0.0.1", "imap_port": imap_port, "imap_security": "none",
                    "imap_user": user, "smtp_host": "127.0.0.1", "smtp_port": smtp_port,
                    "smtp_security": "none", "smtp_user": "steward",
                    "allowed_senders": ["ann@example.com"],
                    "smtp_password_env": "TEST_SMTP_PASSWORD", **email}
        lines.append("[email]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    (home / "config.toml").write_text("\n".join(lines) + "\n")
    os.chmod(home / "config.toml", 0o600)


def secrets(account=None, **extra):
    values = {"TEST_LLM_KEY": LLM_KEY, "SLACK_BOT_TOKEN": BOT_TOKEN,
              "SLACK_APP_TOKEN": APP_TOKEN, "TEST_SMTP_PASSWORD": SMTP_PASSWORD}
    if account is not None:
        values["STEWARD_IMAP_PASSWORD"] = account.password
    values.update(extra)
    return values


async def doctor(home, *args, **env):
    code, out, err = await steward(home, "doctor", "--json", *args,
                                   env=steward_env(home, **env))
    assert "Traceback" not in out + err, err
    rows = {r["check"]: r for r in map(json.loads, out.splitlines())}
    return code, rows, err


def assert_failed(rows, check, *needles):
    row = rows[check]
    assert row["status"] == "fail", row
    for needle in needles:
        assert needle in row["detail"], row
    assert row["fix"], row  # every failure says what to do


async def test_everything_in_place_passes(home, model, slack, account, smtp):
    s = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    await s.close()
    write_config(home, model_url=model.url, slack_url=slack.url, imap_port=account.port,
                 smtp_port=smtp.port, user=account.user)
    code, rows, err = await doctor(home, **secrets(account))
    assert {name: r["status"] for name, r in rows.items()} == {
        "config": "ok", "secrets": "ok", "permissions": "ok", "people": "ok", "service": "ok",
        "limits": "ok", "backup": "ok", "database": "ok", "model": "ok",
        "slack": "ok", "imap": "ok", "smtp": "ok", "clock": "ok"}, rows
    assert code == 0 and err == ""
    assert "revision" in rows["database"]["detail"] and "integrity ok" in rows["database"][
        "detail"]
    assert "fake-model" in rows["model"]["detail"]
    assert f"all {len(bot_scopes())} scopes granted" in rows["slack"]["detail"]
    assert "IDLE" in rows["imap"]["detail"] and "logged in as steward" in rows["smtp"]["detail"]
    # one cheap call to the model, with the key; auth.test and the app token's check
    [call] = [r for r in model.requests if r.path == "/v1/chat/completions"]
    assert call.headers["authorization"] == f"Bearer {LLM_KEY}"
    assert call.body["max_tokens"] <= 16
    assert slack.count("auth.test") == 1 and slack.count("apps.connections.open") == 1


async def test_wrong_secrets_are_failed_rows_with_fixes(home, model, slack, account, smtp):
    model.responder = replies(Reply(status=401))
    slack.scopes = [s for s in bot_scopes() if s not in ("im:write", "files:read")]
    write_config(home, model_url=model.url, slack_url=slack.url, imap_port=account.port,
                 smtp_port=smtp.port, user=account.user, sent_mailbox="Sent Items")
    code, rows, err = await doctor(home, **secrets(account, SLACK_BOT_TOKEN="xoxb-revoked"))
    assert code == 1
    assert_failed(rows, "model", "fake-model")
    assert "TEST_LLM_KEY" in rows["model"]["fix"]
    assert_failed(rows, "slack", "invalid_auth")
    assert "SLACK_BOT_TOKEN" in rows["slack"]["fix"]
    assert_failed(rows, "imap", "no mailbox Sent Items")
    assert '"Sent"' in rows["imap"]["fix"]  # the server's own folders are offered
    assert rows["smtp"]["status"] == "ok"
    assert err.startswith("steward: 3 of 13 checks failed: model: ") and len(
        err.strip().splitlines()) == 1

    # the right token without two scopes; a wrong IMAP and SMTP password
    code, rows, err = await doctor(home, **secrets(account, STEWARD_IMAP_PASSWORD="nope",
                                                   TEST_SMTP_PASSWORD="nope"))
    assert_failed(rows, "slack", "lacks the scopes files:read, im:write")
    assert "reinstall" in rows["slack"]["fix"]
    assert_failed(rows, "imap", account.user)
    assert "STEWARD_IMAP_PASSWORD" in rows["imap"]["fix"]
    assert_failed(rows, "smtp", "login as steward")
    assert code == 1


async def test_unreachable_and_silent_servers_fail_within_the_time_limit(home):
    silent = await Silent().start()
    try:
        write_config(home, model_url=f"http://127.0.0.1:{closed_port()}",
                     slack_url=f"http://127.0.0.1:{silent.port}/api/",
                     imap_port=closed_port(), smtp_port=silent.port)
        started = time.monotonic()
        code, rows, err = await doctor(home, "--timeout", "1", **secrets(
            STEWARD_IMAP_PASSWORD="x"))
        took = time.monotonic() - started
    finally:
        await silent.stop()
    assert code == 1
    assert_failed(rows, "model", "fake-model")
    assert_failed(rows, "slack")
    assert_failed(rows, "imap", "cannot connect")
    assert_failed(rows, "smtp")
    for check in ("slack", "smtp"):  # the silent one: a time limit, not a hang
        assert rows[check]["seconds"] < 3, rows[check]
    assert rows["clock"]["status"] == "skip"  # nobody answered to compare with
    assert took < 20, took


async def test_a_clock_off_by_ten_minutes_fails(home):
    ahead = formatdate(time.time() + 600, usegmt=True)
    server = await Canned({"ok": True, "team": "Fake", "user": "steward"}, {
        "Date": ahead, "x-oauth-scopes": ",".join(bot_scopes())}).start()
    try:
        write_config(home, slack_url=f"http://127.0.0.1:{server.port}/api/")
        code, rows, _ = await doctor(home, **secrets())
    finally:
        await server.stop()
    assert rows["slack"]["status"] == "ok", rows["slack"]
    assert_failed(rows, "clock", "behind 127.0.0.1")
    assert "set-ntp" in rows["clock"]["fix"]
    assert code == 1


async def test_the_database_on_each_backend(home, store_url):
    s = await open_store(store_url)
    await s.close()
    write_config(home, store_url=store_url)
    code, rows, _ = await doctor(home)
    from store.revision import HEAD

    assert rows["database"]["status"] == "ok", rows["database"]
    assert f"revision {HEAD}" in rows["database"]["detail"]
    assert ("PostgreSQL" if "postgresql" in store_url else "SQLite") in rows["database"][
        "detail"]


async def test_a_corrupt_or_newer_database_fails(tmp_path):
    corrupt, newer = tmp_path / "corrupt", tmp_path / "newer"
    for home in (corrupt, newer):
        home.mkdir(mode=0o700)
        s = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
        conv = await s.ensure_conversation("cli:x")
        from store import Writes

        for n in range(200):
            w = Writes()
            w.append(conv.id, "user", f"message {n} " + "x" * 200)
            await s.commit(w)
        await s.close()
    conn = sqlite3.connect(newer / "steward.db")
    conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.commit()
    conn.close()
    db = corrupt / "steward.db"
    data = bytearray(db.read_bytes())
    page = 4096
    for start in range(page * 3, len(data) - page, page * 2):  # scribble over pages
        data[start + 8:start + 200] = b"\xff" * 192
    db.write_bytes(bytes(data))
    code, rows, _ = await doctor(corrupt)
    assert_failed(rows, "database")
    assert ".recover" in rows["database"]["fix"]
    code, rows, _ = await doctor(newer)
    assert_failed(rows, "database", "9999", "newer than this build knows")


async def test_files_others_can_read_are_named_with_the_command_that_fixes_them(home):
    os.chmod(home, 0o755)
    (home / "notes.txt").write_text("private")
    os.chmod(home / "notes.txt", 0o644)
    secrets_file = home / "xdg" / "steward" / "env"
    secrets_file.parent.mkdir(parents=True)
    # (not a model's key: every command reads this file, doctor's model check too)
    secrets_file.write_text("SOME_TOKEN=x\n")
    os.chmod(secrets_file, 0o640)
    code, rows, _ = await doctor(home)
    assert_failed(rows, "permissions", f"{home} 0755", f"{home / 'notes.txt'} 0644",
                  f"{secrets_file} 0640")
    assert f"chmod 700 {home}" in rows["permissions"]["fix"]
    assert code == 1
    for path, mode in ((home, 0o700), (home / "notes.txt", 0o600), (secrets_file, 0o600)):
        os.chmod(path, mode)
    code, rows, _ = await doctor(home)
    assert rows["permissions"]["status"] == "ok" and code == 0, rows


async def test_a_broken_config_or_unset_secrets(home, model):
    (home / "config.toml").write_text("[llm]\nprovider = 'openai'\ntemperature = 3\n")
    code, rows, err = await doctor(home)
    assert code == 2
    assert_failed(rows, "config", f"{home / 'config.toml'}: [llm] temperature: unknown key")
    assert {r["status"] for name, r in rows.items() if name != "config"} == {"skip"}
    assert err.strip().splitlines() == [
        f"steward: 1 of 13 checks failed: config: {home / 'config.toml'}: [llm] temperature: "
        "unknown key"]

    write_config(home, model_url=model.url, slack_url="http://127.0.0.1:9/api/")
    code, rows, _ = await doctor(home)
    assert code == 1 and rows["config"]["status"] == "ok"
    assert_failed(rows, "secrets", "TEST_LLM_KEY", "SLACK_BOT_TOKEN", "SLACK_APP_TOKEN")
    assert rows["model"]["status"] == rows["slack"]["status"] == "skip"
    assert model.requests == []  # nothing is sent without its key


async def test_the_table_has_a_fix_under_each_failure(home):
    os.chmod(home, 0o750)
    code, out, err = await steward(home, "doctor", env=steward_env(home))
    lines = out.splitlines()
    assert lines[0].split() == ["CHECK", "RESULT", "DETAIL"]
    [failed] = [n for n, line in enumerate(lines) if line.startswith("permissions")]
    assert "FAIL" in lines[failed] and lines[failed + 1].strip().startswith(
        f"fix: chmod 700 {home}")
    assert any(line.startswith("model") and " warn " in line for line in lines)  # demo model
    assert code == 1 and len(err.strip().splitlines()) == 1


async def test_names_where_ids_or_addresses_belong_are_failed(home):
    (home / "config.toml").write_text(
        '[slack]\nenabled = true\nallowed_users = ["U0ANN", "bob"]\n'
        '[email]\nenabled = true\naddress = "not-an-email"\nimap_host = "127.0.0.1"\n'
        'smtp_host = "127.0.0.1"\nallowed_senders = ["ann@example.com", "ann"]\n'
        '[agent]\nallowed_recipients = ["@example.org", "bob at example"]\n')
    code, rows, _ = await doctor(home, "--timeout", "2")
    assert code == 1
    assert_failed(rows, "people", "[slack] allowed_users: 'bob' is not a Slack member id",
                  "[email] address: 'not-an-email' is not an email address",
                  "[email] allowed_senders: 'ann' is neither an email address nor @domain",
                  "[agent] allowed_recipients: 'bob at example' is neither")
    assert "Copy member ID" in rows["people"]["fix"]
    (home / "config.toml").write_text('[slack]\nenabled = true\nallowed_users = ["U0ANN"]\n'
                                      '[email]\nenabled = true\naddress = "s@example.org"\n'
                                      'imap_host = "127.0.0.1"\nsmtp_host = "127.0.0.1"\n')
    code, rows, _ = await doctor(home, "--timeout", "2")
    assert rows["people"]["status"] == "warn", rows["people"]
    assert rows["people"]["detail"] == ("Slack answers U0ANN; mail answers nobody "
                                        "([email] allowed_senders is empty)")
