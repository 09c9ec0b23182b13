"""`[backup]`: where `steward backup` writes, how often `steward run` takes one by itself,
how many are kept, and whom they are encrypted to (bot/app/backup.py)::

    [backup]
    dir = "/mnt/usb/steward"       # absolute or ~/...; empty: <home>/backups
    every = "1d"                   # "30m", "12h", "1d", "1w", or hours as a number;
                                   #   empty: not scheduled (`steward backup` by hand)
    keep = 7                       # backups Steward made in `dir` that are kept
    encrypt_to = ["age1..."]       # age recipients (`age-keygen`), one string or a list
    passphrase_env = "STEWARD_BACKUP_PASSPHRASE"  # or/and a passphrase, from this variable
    pg_dump = ""                   # PostgreSQL: the pg_dump to run (default: found)
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator

from bot.config import Section

_UNITS = {"m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_EVERY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([mhdw])\s*")
MIN_EVERY = 60.0  # seconds; a backup reads the whole database


def every_seconds(value: str | int | float) -> float | None:
    """`every` in seconds (None: not scheduled); a ValueError says what is wrong."""
    if isinstance(value, str):
        if not value.strip():
            return None
        found = _EVERY.fullmatch(value.lower())
        if found is None:
            raise ValueError(f'not a period: {value!r}; write e.g. "30m", "12h", "1d", "1w" '
                             "or a number of hours")
        seconds = float(found.group(1)) * _UNITS[found.group(2)]
    else:
        seconds = float(value) * 3600
    if seconds < MIN_EVERY:
        raise ValueError(f"{value!r} is too often: once a minute at most")
    return seconds


class BackupConfig(Section):
    dir: str = ""
    every: str | int | float = ""
    keep: int = Field(7, ge=1, le=10_000)
    encrypt_to: str | list[str] = Field(default_factory=list)
    passphrase_env: str = ""
    pg_dump: str = ""

    def secrets(self) -> list[str]:
        return ["passphrase_env"] if self.passphrase_env else []

    @property
    def every_seconds(self) -> float | None:
        return every_seconds(self.every)

    @property
    def recipients(self) -> list[str]:
        return [self.encrypt_to] if isinstance(self.encrypt_to, str) else list(self.encrypt_to)

    @field_validator("dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if value and not Path(value).expanduser().is_absolute():
            raise ValueError(f"{value!r} is relative: give an absolute path (or ~/...)")
        return value

    @field_validator("every")
    @classmethod
    def _period(cls, value: str | int | float) -> str | int | float:
        every_seconds(value)  # the ValueError says what is wrong
        return value

    @field_validator("encrypt_to")
    @classmethod
    def _age_recipients(cls, value: str | list[str]) -> str | list[str]:
        from pyrage import RecipientError, ssh, x25519

        for recipient in [value] if isinstance(value, str) else value:
            try:
                if recipient.startswith("ssh-"):
                    ssh.Recipient.from_str(recipient)
                else:
                    x25519.Recipient.from_str(recipient)
            except (RecipientError, ValueError) as exc:
                raise ValueError(f"not an age recipient ({recipient[:24]!r}: {exc}); "
                                 "`age-keygen` prints one, starting age1") from None
        return value


def backup_dir(config) -> Path:
    """Where backups go unless `--to` says otherwise: `[backup] dir`, else <home>/backups."""
    return Path(config.backup.dir).expanduser() if config.backup.dir \
        else config.home / "backups"
