"""One `steward run` per home directory: `run.lock` in the home, an exclusive `flock` held
for the life of the process, with the holder's pid written in it for the one refused.

The kernel drops a flock when its holder's last descriptor closes, so a run that was
SIGKILLed, or whose machine lost power, leaves nothing behind that blocks the next; the
pid left in the file is only ever read while the lock is held. The descriptor is not
inherited (Python opens files close-on-exec), so an MCP server a run started cannot keep
the lock after it.

Per home on PostgreSQL too: several workers on one PostgreSQL are meant to have a home
each (README, "Several workers"); two in one home would share its health file, its
backups, its journal and its side indexes. The other commands (`ask`, `chat`, `resume`,
the readers) are not `run` and still share a home with it, as before.

Apart from the runner lock (`bot/runtime/lock.py`), which any command that runs tasks
takes when it can, to learn it is alone on SQLite; this one is `run`'s alone.
"""

import fcntl
import os
from pathlib import Path

from bot.home import make_private

NAME = "run.lock"


class HomeBusy(Exception):
    """Another live `steward run` holds the home."""

    def __init__(self, home: Path, pid: int | None):
        self.home, self.pid = home, pid
        who = f"pid {pid}" if pid else "its pid unknown"
        super().__init__(
            f"this home ({home}) is already served by `steward run`, {who}; one `run` per "
            "home: stop that one first (if it is the service: systemctl --user stop "
            "steward), or give this one a home of its own (--home)")


class HomeLock:
    def __init__(self, home: Path):
        self.home = home
        self.path = home / NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise `HomeBusy` (blocking: call it in a thread)."""
        make_private(self.home)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(fd)
            os.close(fd)
            raise HomeBusy(self.home, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # a pid no longer there says nothing
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "HomeLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _pid_in(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
