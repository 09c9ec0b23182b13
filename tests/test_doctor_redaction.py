"""No secret in what Steward prints about a failure (issue 32): `steward doctor`, text and
`--json`, against a real HTTP server standing in for the model provider that answers 401
echoing the key it was sent, as OpenAI does ("Incorrect API key provided: sk-...");
and `redact` itself, on the shapes of key it must know and the text it must leave be."""

import json
import os

import pytest

from bot.redact import redact
from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.test_cli import steward, steward_env

JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJzdGV3YXJkIn0."
       "c2lnbmF0dXJlLW9mLWEtand0")
SHORT = "sk-abc123"
KEYS = {
    "openai": "sk-proj-Q8xV2mN4pL7rT1wY9zK3bH6cJ0dF5gS8",
    "jwt": JWT,
    "short proxy key": SHORT,
    "no known shape": "hunter2hunter2",  # only the config says it is a secret
}
# Other secrets the provider's answer carries: no config names them, their shape does.
ALSO_ECHOED = ["eyJhbGciOiJub25lIn0.eyJ1c2VyIjoiYW5hIn0.", "sk-9x8y7z", "xyz-proxy-tok3n",
               "AIzaShortQueryKey12"]


@pytest.fixture
def provider():
    """Answers every call 401, echoing the Authorization header it got, and more."""
    with FakeLLMServer() as server:
        def answer(_body, _wire):
            sent = server.requests[-1].headers.get("authorization", "")
            key = sent.removeprefix("Bearer ")
            message = (f"Incorrect API key provided: {key}. You can find your API key at "
                       f"https://platform.openai.com/account/api-keys. (Authorization: {sent}; "
                       f"upstream said: token {ALSO_ECHOED[0]} refused for {ALSO_ECHOED[1]}, "
                       f"Bearer {ALSO_ECHOED[2]}, GET /v1/models?key={ALSO_ECHOED[3]})")
            return Reply(status=401, error_body={"error": {
                "message": message, "type": "invalid_request_error",
                "code": "invalid_api_key"}})
        server.responder = answer
        yield server


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    return home


@pytest.mark.parametrize("key", KEYS.values(), ids=KEYS.keys())
async def test_doctor_never_prints_the_key_the_provider_echoes(home, provider, key):
    config = home / "config.toml"
    config.write_text(f'[llm]\nprovider = "openai"\nbase_url = "{provider.url}/v1"\n'
                      'model = "fake-model"\napi_key_env = "TEST_LLM_KEY"\n')
    os.chmod(config, 0o600)
    env = steward_env(home, TEST_LLM_KEY=key)
    for args in (["doctor"], ["doctor", "--json"]):
        code, out, err = await steward(home, *args, env=env)
        assert code == 1 and "Traceback" not in out + err, err
        shown = out + err
        for secret in [key, *ALSO_ECHOED]:
            assert secret not in shown, (secret, shown)
        assert "[redacted]" in shown and "Incorrect API key provided" in shown
        assert "fake-model" in shown and "TEST_LLM_KEY" in shown  # still says what to fix
        assert err.startswith("steward: 1 of ")
    rows = {r["check"]: r for r in map(json.loads, out.splitlines())}
    assert rows["model"]["status"] == "fail" and "HTTP 401" in rows["model"]["detail"]
    # The key was really sent (and echoed): what was kept out of the output was there.
    assert provider.requests[-1].headers["authorization"] == f"Bearer {key}"


@pytest.mark.parametrize(("text", "gone"), [
    (f"Incorrect API key provided: {JWT}.", JWT),
    (f"bad token {JWT[:-10]}", JWT[:-10]),  # the signature part may be short
    ("alg none: eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.", "eyJzdWIiOiJ4In0"),
    (f"Incorrect API key provided: {SHORT}.", "abc123"),
    ("key sk-1234 refused", "1234"),  # LiteLLM's example master key
    ("Authorization: Bearer xyz refused", "xyz"),
    ("bearer abc.def-ghi", "abc.def"),
    ("GET https://x.example/v1?api_key=abc123&model=m", "abc123"),
    ("GET https://x.example/v1?key=AIzaQ&alt=sse", "AIzaQ"),
    ('{"api_key": "plain-value-9"}', "plain-value-9"),
    ("x-api-key: ak_77 missing", "ak_77"),
    ("password=hunter2 wrong", "hunter2"),
    ("slack said xoxb-1-2-abc and xapp-1-A0-3", "xoxb-1"),
    ("github ghp_abcdefghij0123456789", "ghp_"),
    ("a long opaque 0123456789abcdefghijABCDEFGHIJ0123456789", "0123456789abcdefghij"),
])
def test_redact_takes_out_every_shape_of_key(text, gone):
    out = redact(text)
    assert gone not in out and "[redacted]" in out, out


@pytest.mark.parametrize("text", [
    "openai fake-model: HTTP 401: invalid_api_key (check the API key in the environment "
    "variable TEST_LLM_KEY)",
    "[llm] api_key_env: must name an environment variable",
    "the token lacks the scopes files:read, im:write",
    "auth.test: invalid_auth",
    "cannot reach https://api.openai.com/v1: ConnectError: [Errno 111] Connection refused",
    "a task-abc and a desk-lamp, monkey-patch, risk-free, the key-value store",
    "SQLite /home/ana/.local/share/steward/steward.db, revision 0012, integrity ok, 1.2 MB",
    "keys are checked; the password is wrong; the token expired",
    "home /srv/a-rather-long-directory-name-for-the-home 0700, its files 0600",
])
def test_redact_leaves_plain_text_alone(text):
    assert redact(text) == text


def test_the_configured_secrets_are_taken_out_verbatim():
    known = ["hunter2hunter2", "correct horse battery", "p@ss/w0rd&x"]
    text = ("login failed for hunter2hunter2; said 'correct horse battery'; "
            "url-encoded p%40ss%2Fw0rd%26x; raw p@ss/w0rd&x")
    out = redact(text, known)
    for secret in [*known, "p%40ss%2Fw0rd%26x"]:
        assert secret not in out, out
    assert out.startswith("login failed for [redacted]; said '[redacted]'")
    # An empty or placeholder value names nothing; text without secrets is left be.
    assert redact("the same text", ["", "   "]) == "the same text"


def test_every_secret_the_config_reads_is_known(tmp_path):
    """What doctor redacts verbatim: each variable the config names, the auto-detected
    provider key, what an MCP server is sent, and the store URL's password."""
    from bot.app.config import build_config
    from bot.app.doctor_checks import known_secrets

    env = {"LLM": "llm-key-1", "SLACK_BOT_TOKEN": "xoxb-bot", "SLACK_SIGNING_SECRET": "signs",
           "STEWARD_IMAP_PASSWORD": "imap-pw", "STEWARD_SMTP_PASSWORD": "smtp-pw",
           "TRACKER_AUTH": "Bearer tracker", "DRIVE_TOKEN": "drive-tok",
           "OPENAI_API_KEY": "sk-detected", "HOME": "/home/ana", "LOG_LEVEL": "warn"}
    config = build_config({
        "store": {"url": "postgresql+asyncpg://steward:db-pass@db.example/steward"},
        "llm": {"provider": "openai", "model": "m", "api_key_env": "LLM"},
        "slack": {"enabled": True, "mode": "http", "allowed_users": ["U1"]},
        "email": {"enabled": True, "address": "s@example.com", "imap_host": "imap.example",
                  "smtp_host": "smtp.example", "smtp_user": "s", "allow_everyone": True},
        "mcp": {"servers": [
            {"name": "files", "command": "npx", "env": {"LOG_LEVEL": "warn"},
             "pass_env": ["DRIVE_TOKEN"]},
            {"name": "tracker", "url": "https://tracker.example/mcp",
             "headers_env": {"Authorization": "TRACKER_AUTH"}}]},
    }, home=tmp_path, env=env)
    known = known_secrets(config, env)
    assert set(known) == {"llm-key-1", "xoxb-bot", "signs", "imap-pw", "smtp-pw",
                          "Bearer tracker", "drive-tok", "sk-detected", "db-pass"}
    # A config that did not load: still the provider keys the environment holds.
    assert known_secrets(None, env) == ["sk-detected"]


def test_a_commands_error_line_never_shows_a_secret(tmp_path, monkeypatch):
    """Every command's error path, not only doctor's: the one line `steward` prints for a
    failure goes through the same redaction, the config's own secrets by value."""
    from bot.app.commands import _without_secrets
    from bot.app.config import build_config

    monkeypatch.setenv("LLM", "hunter2hunter2")
    config = build_config({"llm": {"provider": "openai", "model": "m", "api_key_env": "LLM"}},
                          home=tmp_path, env={"LLM": "hunter2hunter2"})
    line = ("the provider said: Incorrect API key provided: hunter2hunter2; also "
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl and sk-abc123")
    shown = _without_secrets(line, config)
    for secret in ("hunter2hunter2", "eyJhbGciOiJIUzI1NiJ9", "sk-abc123"):
        assert secret not in shown, shown
    assert shown.startswith("the provider said: Incorrect API key provided:")
    assert "sk-abc123" not in _without_secrets(line, None)
