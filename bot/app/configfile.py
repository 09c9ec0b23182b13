"""The config as `init`, `doctor` and `service` read it: the one place they import the
loader from, and a way to read a file whose secrets are not in this environment (a
service gets them from its environment file; doctor reports them instead of stopping)."""

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

from bot.app.config import ConfigError, build_config, find_config_path, load_config, resolve_home
from bot.app.config import StewardConfig as Config
from bot.app.secrets_file import user_config_dir

__all__ = ["Config", "ConfigError", "Loaded", "check_text", "default_path", "load",
           "load_lenient", "missing_secrets", "user_config_dir"]

_UNSET = re.compile(r"^environment variable (\S+) is not set$")
PLACEHOLDER = "(unset)"  # stands in for a missing secret; never sent anywhere


def load(args, env: Mapping[str, str] = os.environ) -> Config:
    return load_config(args.config, args.home, env, Path.cwd())


def missing_secrets(error: ConfigError) -> list[str] | None:
    """The variables `error` says are unset, or None when it says anything else too."""
    names = []
    for _where, what in error.problems:
        found = _UNSET.match(what)
        if found is None:
            return None
        names.append(found.group(1))
    return names


class Loaded:
    """A config that loaded but for its secrets: `missing` names the unset variables."""

    def __init__(self, config: Config, missing: list[str]):
        self.config = config
        self.missing = missing


def load_lenient(args, env: Mapping[str, str] = os.environ) -> Loaded:
    """The config even if some of its secrets are unset; any other problem raises."""
    try:
        return Loaded(load(args, env), [])
    except ConfigError as exc:
        missing = missing_secrets(exc)
        if not missing:
            raise
    return Loaded(load(args, {**env, **dict.fromkeys(missing, PLACEHOLDER)}), missing)


def default_path(env: Mapping[str, str] = os.environ, cwd: Path | None = None) -> Path:
    """Where `steward init` writes when not told: the file Steward would read (from
    $STEWARD_CONFIG, ./config.toml or the user's config dir), else the user's config dir,
    which is found from any directory (a service's too)."""
    cwd = cwd or Path.cwd()
    if env.get("STEWARD_CONFIG"):
        return _absolute(Path(env["STEWARD_CONFIG"]).expanduser(), cwd)
    found = find_config_path(None, env, cwd)
    return found if found is not None else user_config_dir(env) / "config.toml"


def _absolute(path: Path, cwd: Path) -> Path:
    return path if path.is_absolute() else cwd / path


def check_text(text: str, path: Path, home: str | None, env: Mapping[str, str]) -> Config:
    """Validate config text as `load` would read it from `path` (unset secrets allowed)."""
    data = tomllib.loads(text)
    home_dir = resolve_home(home, env, Path.cwd())
    try:
        return build_config(data, home=home_dir, path=path, env=env)
    except ConfigError as exc:
        missing = missing_secrets(exc)
        if not missing:
            raise
    return build_config(data, home=home_dir, path=path,
                        env={**env, **dict.fromkeys(missing, PLACEHOLDER)})
