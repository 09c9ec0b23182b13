"""Config loading: search order, defaults, the example file, one-line errors."""

from pathlib import Path

import pytest

from bot.app.config import (
    ConfigError,
    build_config,
    find_config_path,
    load_config,
    resolve_home,
)
from bot.app.config import (
    StewardConfig as Config,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.toml"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """An environment whose HOME is a temp dir, so nothing real is ever found."""
    home = tmp_path / "userhome"
    home.mkdir()
    return {"HOME": str(home)}


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "cwd"
    path.mkdir()
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def load_text(cwd: Path, env: dict[str, str], text: str) -> Config:
    write(cwd / "config.toml", text)
    return load_config(env=env, cwd=cwd, cli_home=str(cwd / "data"))


def error_of(cwd: Path, env: dict[str, str], text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_text(cwd, env, text)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------- defaults


def test_no_file_gives_defaults_and_sqlite_under_home(env, cwd, tmp_path):
    config = load_config(env=env, cwd=cwd, cli_home=str(tmp_path / "h"))
    assert config.path is None
    assert config.home == tmp_path / "h"
    assert config.store_url == f"sqlite+aiosqlite:///{tmp_path / 'h' / 'steward.db'}"
    assert config.llm.provider is None
    assert config.llm.context_window == 128000
    assert not config.slack.enabled and not config.email.enabled
    assert config.slack.mode == "socket" and config.slack.http_port == 3000
    assert config.email.imap_port == 993 and config.email.smtp_security == "ssl"
    assert config.runtime.concurrency == 8 and config.runtime.lease_seconds == 15.0


def test_empty_file_gives_defaults(env, cwd):
    config = load_text(cwd, env, "")
    assert config.path == cwd / "config.toml"
    assert config.model_dump() == Config().model_dump()


def test_example_file_loads_and_equals_defaults(env, tmp_path):
    config = load_config(cli_config=str(EXAMPLE), env=env, cwd=tmp_path)
    assert config.path == EXAMPLE
    assert config.model_dump() == Config().model_dump()


def test_example_file_documents_every_key():
    text = EXAMPLE.read_text(encoding="utf-8")
    for section, model in Config.model_fields.items():
        assert f"[{section}]" in text
        for key in model.annotation.model_fields:
            assert f"\n{key} = " in text or f"\n# {key} = " in text, (section, key)


def test_explicit_store_url_is_used(env, cwd):
    config = load_text(cwd, env, '[store]\nurl = "postgresql+asyncpg://u@db/steward"\n')
    assert config.store_url == "postgresql+asyncpg://u@db/steward"


# ---------------------------------------------------------------- search order


def test_home_order(env, tmp_path):
    assert resolve_home("/a", {**env, "STEWARD_HOME": "/b"}) == Path("/a")
    assert resolve_home(None, {**env, "STEWARD_HOME": "/b", "XDG_DATA_HOME": "/x"}) == Path("/b")
    assert resolve_home(None, {**env, "XDG_DATA_HOME": "/x"}) == Path("/x/steward")
    assert resolve_home(None, env) == Path(env["HOME"]) / ".local/share/steward"
    assert resolve_home("rel", env, cwd=tmp_path) == tmp_path / "rel"


def test_cli_config_wins(env, cwd, tmp_path):
    chosen = write(tmp_path / "chosen.toml", "")
    write(tmp_path / "envfile.toml", "")
    write(cwd / "config.toml", "")
    env = {**env, "STEWARD_CONFIG": str(tmp_path / "envfile.toml")}
    assert find_config_path(str(chosen), env, cwd) == chosen


def test_cli_config_missing_is_an_error(env, cwd, tmp_path):
    write(cwd / "config.toml", "")
    with pytest.raises(ConfigError) as info:
        find_config_path(str(tmp_path / "nope.toml"), env, cwd)
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: config file not found (from --config)"


def test_steward_config_env_is_second(env, cwd, tmp_path):
    envfile = write(tmp_path / "envfile.toml", "")
    write(cwd / "config.toml", "")
    assert find_config_path(None, {**env, "STEWARD_CONFIG": str(envfile)}, cwd) == envfile


def test_steward_config_env_missing_is_an_error(env, cwd, tmp_path):
    with pytest.raises(ConfigError, match=r"not found \(from \$STEWARD_CONFIG\)"):
        find_config_path(None, {**env, "STEWARD_CONFIG": str(tmp_path / "gone.toml")}, cwd)


def test_cwd_config_is_third(env, cwd, tmp_path):
    local = write(cwd / "config.toml", "")
    write(tmp_path / "xdg" / "steward" / "config.toml", "")
    assert find_config_path(None, {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}, cwd) == local


def test_xdg_config_is_fourth(env, cwd, tmp_path):
    xdg = write(tmp_path / "xdg" / "steward" / "config.toml", "")
    assert find_config_path(None, {**env, "XDG_CONFIG_HOME": str(tmp_path / "xdg")}, cwd) == xdg


def test_xdg_config_defaults_to_dot_config(env, cwd):
    user = write(Path(env["HOME"]) / ".config" / "steward" / "config.toml", "")
    assert find_config_path(None, env, cwd) == user


def test_nothing_found_is_none(env, cwd):
    assert find_config_path(None, env, cwd) is None


def test_load_config_reads_the_found_file(env, cwd):
    config = load_text(cwd, env, '[llm]\nprovider = "scripted"\nmodel = "m"\n')
    assert config.llm.provider == "scripted" and config.llm.model == "m"


# ---------------------------------------------------------------- errors


def test_unknown_key_in_section(env, cwd):
    message = error_of(cwd, env, '[llm]\ncolour = "blue"\n')
    assert message == f"{cwd / 'config.toml'}: [llm] colour: unknown key"


def test_unknown_top_level_section(env, cwd):
    message = error_of(cwd, env, "[telegram]\nenabled = true\n")
    assert message == f"{cwd / 'config.toml'}: telegram: unknown key"


def test_unknown_top_level_key(env, cwd):
    message = error_of(cwd, env, "debug = true\n")
    assert message == f"{cwd / 'config.toml'}: debug: unknown key"


def test_section_that_is_not_a_table(env, cwd):
    message = error_of(cwd, env, "slack = 1\n")
    assert message == f"{cwd / 'config.toml'}: [slack]: must be a table (got 1)"


def test_wrong_type(env, cwd):
    message = error_of(cwd, env, '[slack]\nhttp_port = "3000"\n')
    assert message == (
        f"{cwd / 'config.toml'}: [slack] http_port: Input should be a valid integer (got '3000')"
    )


def test_out_of_range(env, cwd):
    message = error_of(cwd, env, "[slack]\nhttp_port = 70000\n")
    assert "[slack] http_port: Input should be less than or equal to 65535" in message


def test_bad_literal(env, cwd):
    message = error_of(cwd, env, '[slack]\nmode = "udp"\n')
    assert message == (
        f"{cwd / 'config.toml'}: [slack] mode: Input should be 'socket' or 'http' (got 'udp')"
    )


def test_several_errors_on_one_line(env, cwd):
    message = error_of(cwd, env, '[llm]\ncontext_window = 0\ncolour = 1\n[slack]\nmode = "x"\n')
    assert message.startswith(f"{cwd / 'config.toml'}: ")
    assert message.count("; ") == 2
    assert "[llm] context_window: Input should be greater than 0 (got 0)" in message
    assert "[llm] colour: unknown key" in message
    assert "[slack] mode: " in message


def test_list_item_location(env, cwd):
    message = error_of(cwd, env, '[slack]\nallowed_users = ["U1", 2]\n')
    assert "[slack] allowed_users[1]: Input should be a valid string (got 2)" in message


def test_invalid_toml(env, cwd):
    message = error_of(cwd, env, '[llm]\nmodel = "a"\nmodel_x = \n')
    assert message == f"{cwd / 'config.toml'}: invalid TOML at line 3: Invalid value (column 11)"


def test_invalid_toml_at_end(env, cwd):
    message = error_of(cwd, env, '[llm]\nmodel = "a\n')
    assert message.startswith(f"{cwd / 'config.toml'}: invalid TOML at line 2: ")


def test_not_utf8(env, cwd):
    (cwd / "config.toml").write_bytes(b'[llm]\nmodel = "\xff"\n')
    with pytest.raises(ConfigError, match=r"config\.toml: not valid UTF-8 at byte 15$"):
        load_config(env=env, cwd=cwd)


def test_bad_store_url_scheme(env, cwd):
    message = error_of(cwd, env, '[store]\nurl = "mysql://u@h/db"\n')
    assert message.startswith(f"{cwd / 'config.toml'}: [store] url: unsupported scheme 'mysql'; ")


@pytest.mark.parametrize("scheme", ["postgres", "postgresql", "postgresql+asyncpg",
                                    "POSTGRESQL"])
def test_the_common_postgresql_url_spellings_mean_the_driver_url(env, cwd, scheme):
    config = load_text(cwd, env, f'[store]\nurl = "{scheme}://ann:pw@db.lan:5433/steward"\n')
    assert config.store.url == config.store_url == \
        "postgresql+asyncpg://ann:pw@db.lan:5433/steward"


def test_store_url_without_scheme(env, cwd):
    message = error_of(cwd, env, '[store]\nurl = "steward.db"\n')
    assert "[store] url: not a database URL; " in message


def test_email_enabled_requires_hosts(env, cwd):
    message = error_of(cwd, env, '[email]\nenabled = true\naddress = "bot@example.org"\n')
    assert message == (
        f"{cwd / 'config.toml'}: [email] imap_host: must be set when enabled = true; "
        "[email] smtp_host: must be set when enabled = true"
    )


def test_retry_max_below_base(env, cwd):
    message = error_of(cwd, env, "[runtime]\nretry_base_seconds = 10\nretry_max_seconds = 5\n")
    assert "[runtime] retry_max_seconds: must be >= retry_base_seconds (10.0)" in message


# ---------------------------------------------------------------- secrets


def test_slack_enabled_without_token(env, cwd):
    message = error_of(cwd, env, "[slack]\nenabled = true\n")
    assert message == (
        f"{cwd / 'config.toml'}: "
        "[slack] bot_token_env: environment variable SLACK_BOT_TOKEN is not set; "
        "[slack] app_token_env: environment variable SLACK_APP_TOKEN is not set"
    )


def test_slack_empty_variable_counts_as_unset(env, cwd):
    env = {**env, "SLACK_BOT_TOKEN": "", "SLACK_APP_TOKEN": "xapp"}
    message = error_of(cwd, env, "[slack]\nenabled = true\n")
    assert message.endswith(
        ": [slack] bot_token_env: environment variable SLACK_BOT_TOKEN is not set"
    )


def test_slack_secrets_present(env, cwd):
    env = {**env, "SLACK_BOT_TOKEN": "xoxb-1", "SLACK_APP_TOKEN": "xapp-1"}
    config = load_text(cwd, env, "[slack]\nenabled = true\n")
    assert config.secret(config.slack.bot_token_env) == "xoxb-1"
    assert config.secret("SLACK_APP_TOKEN") == "xapp-1"


def test_slack_http_mode_needs_signing_secret_not_app_token(env, cwd):
    text = '[slack]\nenabled = true\nmode = "http"\nsigning_secret_env = "MY_SECRET"\n'
    message = error_of(cwd, env | {"SLACK_BOT_TOKEN": "x"}, text)
    assert message.endswith(
        ": [slack] signing_secret_env: environment variable MY_SECRET is not set"
    )
    config = load_text(cwd, env | {"SLACK_BOT_TOKEN": "x", "MY_SECRET": "s"}, text)
    assert config.slack.mode == "http"


def test_disabled_connectors_need_no_secrets(env, cwd):
    config = load_text(cwd, env, '[slack]\nbot_token_env = "NOPE"\n')
    assert config.slack.bot_token_env == "NOPE"


def test_email_secrets(env, cwd):
    text = (
        '[email]\nenabled = true\naddress = "bot@example.org"\nimap_host = "imap.example.org"\n'
        'smtp_host = "smtp.example.org"\nsmtp_user = "bot"\n'
    )
    message = error_of(cwd, env | {"STEWARD_IMAP_PASSWORD": "p"}, text)
    assert message.endswith(
        ": [email] smtp_password_env: environment variable STEWARD_SMTP_PASSWORD is not set"
    )
    full = env | {"STEWARD_IMAP_PASSWORD": "p", "STEWARD_SMTP_PASSWORD": "q"}
    assert load_text(cwd, full, text).secret("STEWARD_SMTP_PASSWORD") == "q"
    no_smtp_user = text.replace('smtp_user = "bot"\n', "")
    assert load_text(cwd, env | {"STEWARD_IMAP_PASSWORD": "p"}, no_smtp_user).email.enabled


def test_llm_api_key_env_checked_only_when_named(env, cwd):
    message = error_of(cwd, env, '[llm]\napi_key_env = "OPENAI_API_KEY"\n')
    assert message.endswith(": [llm] api_key_env: environment variable OPENAI_API_KEY is not set")
    text = '[llm]\napi_key_env = "OPENAI_API_KEY"\n'
    config = load_text(cwd, env | {"OPENAI_API_KEY": "sk"}, text)
    assert config.secret(config.llm.api_key_env) == "sk"


def test_secret_uses_env_captured_at_load(env, cwd):
    live = env | {"SLACK_BOT_TOKEN": "a", "SLACK_APP_TOKEN": "b"}
    config = load_text(cwd, live, "[slack]\nenabled = true\n")
    live["SLACK_BOT_TOKEN"] = "changed"
    assert config.secret("SLACK_BOT_TOKEN") == "a"
    with pytest.raises(ConfigError, match="environment variable OTHER is not set"):
        config.secret("OTHER")


def test_build_config_without_file(tmp_path):
    config = build_config({"runtime": {"concurrency": 2}}, home=tmp_path)
    assert config.runtime.concurrency == 2 and config.path is None
    with pytest.raises(ConfigError) as info:
        build_config({"runtime": {"concurrency": 0}}, home=tmp_path)
    assert str(info.value) == (
        "(no config file): "
        "[runtime] concurrency: Input should be greater than or equal to 1 (got 0)"
    )
