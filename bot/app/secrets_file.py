"""The secrets file: `<config dir>/steward/env` (`~/.config/steward/env`), KEY=value lines.

`steward service install` creates it (0600) for the service, whose unit reads it as its
environment; every `steward` command reads it too, so that the secrets are filled in once,
in one place, for the service and the shell alike. A variable set in the environment wins
over the file. A file others can read is still used, with a warning that says how to make
it private (doctor's permissions row says so as well).

Light on purpose (the standard library only): every command reads it before anything else.
"""

import os
import stat
from collections.abc import Mapping, MutableMapping
from pathlib import Path

NAME = "env"


def user_config_dir(env: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_CONFIG_HOME/steward`, else `~/.config/steward`."""
    base = env.get("XDG_CONFIG_HOME")
    root = Path(base).expanduser() if base else Path(env.get("HOME") or Path.home()) / ".config"
    return (root if root.is_absolute() else Path.cwd() / root) / "steward"


def path(env: Mapping[str, str] = os.environ) -> Path:
    """Where the secrets file is (whether or not it exists)."""
    return user_config_dir(env) / NAME


def parse(text: str) -> dict[str, str]:
    """KEY=VALUE lines (systemd's EnvironmentFile format: # comments, optional quotes, an
    `export ` prefix tolerated)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            line = line[len("export "):]
        key, sep, value = line.partition("=")
        if sep and key and not key.startswith("#"):
            values[key.strip()] = value.strip().strip("'\"")
    return values


def read(file: Path) -> dict[str, str]:
    """The file's variables; {} when it does not exist."""
    try:
        return parse(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def load(environ: MutableMapping[str, str]) -> list[str]:
    """Put the file's variables into `environ` where it has none of its own; the warnings
    to show (a file others can read, a file that cannot be read)."""
    file = path(environ)
    try:
        mode = file.stat().st_mode
        values = read(file)
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        return [f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}"]
    for name, value in values.items():
        if value and not environ.get(name):
            environ[name] = value
    if mode & 0o077:
        return [f"{file} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                f"chmod 600 {file}"]
    return []
