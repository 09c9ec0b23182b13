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
    except (FileNotFoundError, NotADirectoryError):
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


def template(needed: list[str]) -> str:
    lines = ["# Steward's secrets: KEY=value, one a line, no quotes. The service and every",
             "# steward command read this file (a variable set in the environment wins).",
             "# It is private (0600); Steward never writes a value into it."]
    lines += [f"#{name}=" for name in dict.fromkeys(needed)] or ["# (this config needs none)"]
    return "\n".join(lines) + "\n"


def create(file: Path, needed: list[str]) -> str | None:
    """Make the file (0600) naming the variables `needed`, commented out, unless it exists;
    one that others can read is made private. What was done to an existing file, if
    anything, as a line to show."""
    file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = file.stat().st_mode
        if mode & 0o077:  # it holds secrets: others must not read it
            os.chmod(file, mode & 0o700)
            return f"made {file} private (it was readable by others)"
        return None
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(template(needed))
    return None
