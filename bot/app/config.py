"""The whole config file: the core's sections (bot/config.py) and each connector's own,
assembled here, the one place that knows every connector."""

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from pydantic import Field

from bot import config as core
from bot.app.backup_config import BackupConfig
from bot.app.config_snapshot import remember
from bot.config import ConfigError, find_config_path, resolve_home  # noqa: F401 (re-exported)
from bot.config_source import Found, locate
from connectors.email.config import EmailConfig
from connectors.slack.config import SlackConfig


class StewardConfig(core.Config):
    slack: SlackConfig = Field(default_factory=SlackConfig)
    email: EmailConfig = Field(default_factory=EmailConfig)
    backup: BackupConfig = Field(default_factory=BackupConfig)


def load_config(cli_config: str | None = None, cli_home: str | None = None,
                env: Mapping[str, str] = os.environ, cwd: Path | None = None, *,
                needs: Collection[str] | None = None) -> StewardConfig:
    """Find, read, validate and check the config; raise ConfigError on any problem.
    `needs`: the sections whose secrets must be set (None: all; bot/config.py)."""
    return load_found(locate(cli_config, cli_home, env, cwd if cwd else Path.cwd()), env,
                      needs=needs)


def load_found(found: Found, env: Mapping[str, str] = os.environ, *,
               needs: Collection[str] | None = None) -> StewardConfig:
    """Validate and check the config `locate` found, and remember the result for the
    reading commands (bot/app/config_snapshot.py)."""
    config = core.load_found(found, env, model=StewardConfig, needs=needs)
    remember(config, found)
    return config


def build_config(data: Mapping[str, Any], *, home: Path, path: Path | None = None,
                 env: Mapping[str, str] | None = None) -> StewardConfig:
    """Validate already-parsed TOML data (also handy in tests: no file needed)."""
    return core.build_config(data, home=home, path=path, env=env, model=StewardConfig)
