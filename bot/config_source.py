"""Where the config file and the home are, and how the file is read: everything about the
config that needs no validation, so that a command may find and read its config without
loading pydantic (bot/app/config_snapshot.py). The sections themselves are bot/config.py.
"""

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

SQLITE_SCHEME = "sqlite+aiosqlite"
POSTGRES_SCHEME = "postgresql+asyncpg"
DB_FILENAME = "steward.db"
CONFIG_NAME = "config.toml"
NO_FILE = "(no config file)"


class ConfigError(Exception):
    """A config problem, rendered as one line: ``<file>: <where>: <what>[; ...]``.

    ``path`` is the file (or None), ``problems`` a list of ``(where, what)`` pairs where
    ``where`` reads like ``[slack] mode`` (or ``""`` for a whole-file problem).
    """

    def __init__(self, path: Path | str | None, problems: list[tuple[str, str]]) -> None:
        self.path = Path(path) if path is not None else None
        self.problems = problems
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [f"{where}: {what}" if where else what for where, what in self.problems]
        text = f"{self.path if self.path is not None else NO_FILE}: " + "; ".join(parts)
        return " ".join(text.split())  # always one line


class Found(NamedTuple):
    """Where a command's config is: the file (None: the defaults), its bytes as read, and
    the home."""

    path: Path | None
    raw: bytes | None
    home: Path

    def data(self) -> dict[str, Any]:
        return parse_toml(self.path, self.raw) if self.path is not None else {}


def locate(cli_config: str | None, cli_home: str | None, env: Mapping[str, str],
           cwd: Path) -> Found:
    """Find the config file and the home and read the file (not parse it)."""
    path = find_config_path(cli_config, env, cwd)
    return Found(path, read_bytes(path) if path is not None else None,
                 resolve_home(cli_home, env, cwd))


def secret(env: Mapping[str, str], env_name: str, path: Path | None) -> str:
    """The value of the variable `env_name` names, or the ConfigError saying it is unset."""
    value = env.get(env_name, "") if env_name else ""
    if not value:
        where = f"environment variable {env_name}" if env_name else "secret name"
        raise ConfigError(path, [("", f"{where} is not set")])
    return value


def store_url(url: str, home: Path) -> str:
    """The effective SQLAlchemy URL of `[store] url`: empty is the SQLite file in the home."""
    return url or f"{SQLITE_SCHEME}:///{home / DB_FILENAME}"


def _user_home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _expand(raw: str, env: Mapping[str, str], cwd: Path) -> Path:
    if raw == "~" or raw.startswith("~/"):
        path = _user_home(env) / raw[2:]
    else:
        path = Path(raw).expanduser()
    return path if path.is_absolute() else cwd / path


def resolve_home(cli_home: str | None, env: Mapping[str, str], cwd: Path | None = None) -> Path:
    """``--home``, else ``$STEWARD_HOME``, else ``$XDG_DATA_HOME/steward``, else
    ``~/.local/share/steward``. Always absolute; nothing is created."""
    cwd = cwd if cwd is not None else Path.cwd()
    if cli_home:
        return _expand(cli_home, env, cwd)
    if env.get("STEWARD_HOME"):
        return _expand(env["STEWARD_HOME"], env, cwd)
    if env.get("XDG_DATA_HOME"):
        return _expand(env["XDG_DATA_HOME"], env, cwd) / "steward"
    return _user_home(env) / ".local" / "share" / "steward"


def find_config_path(cli_config: str | None, env: Mapping[str, str], cwd: Path) -> Path | None:
    """``--config`` (must exist; a directory: its config.toml), else ``$STEWARD_CONFIG``
    (the same), else ``cwd/config.toml``, else ``$XDG_CONFIG_HOME/steward/config.toml``
    (``~/.config/steward/config.toml``) if it exists, else None."""
    for raw, origin in ((cli_config, "--config"), (env.get("STEWARD_CONFIG"), "$STEWARD_CONFIG")):
        if raw:
            path = _expand(raw, env, cwd)
            if path.is_dir():  # the directory that holds it (`--config ~/.config/steward`)
                if not (path / CONFIG_NAME).is_file():
                    raise ConfigError(path, [("", f"no {CONFIG_NAME} in this directory "
                                                  f"(from {origin})")])
                return path / CONFIG_NAME
            if not path.is_file():
                raise ConfigError(path, [("", f"config file not found (from {origin})")])
            return path
    local = cwd / CONFIG_NAME
    if local.is_file():
        return local
    xdg = env.get("XDG_CONFIG_HOME")
    config_dir = _expand(xdg, env, cwd) if xdg else _user_home(env) / ".config"
    user = config_dir / "steward" / CONFIG_NAME
    return user if user.is_file() else None


_TOML_POSITION = re.compile(
    r"^(?P<msg>.*?)\s*\(at (?:line (?P<line>\d+), column (?P<col>\d+)|end of document)\)$"
)


def read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(path, [("", f"cannot read: {exc.strerror or exc}")]) from None


def parse_toml(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(path, [("", f"not valid UTF-8 at byte {exc.start}")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, [("", _describe_toml_error(str(exc)))]) from None


def _describe_toml_error(text: str) -> str:
    match = _TOML_POSITION.match(text.strip())
    if match is None:
        return f"invalid TOML: {text}"
    if match["line"] is None:
        return f"invalid TOML at end of document: {match['msg']}"
    return f"invalid TOML at line {match['line']}: {match['msg']} (column {match['col']})"
