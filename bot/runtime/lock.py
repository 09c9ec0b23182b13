"""A runner lock in the home directory: the process holding it knows it is the only
runner on an SQLite store, so on start it may resume every `running` task at once instead
of waiting for their leases to expire. Taking it also makes the home private (`bot.home`):
the directory 0700, the files in it 0600, the lock file included."""

import fcntl
import os
from pathlib import Path

from bot.home import make_private


class RunnerLock:
    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Non-blocking; False if another live process holds it. The kernel drops the lock
        when its holder dies, however it dies."""
        make_private(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if os.fstat(fd).st_mode & 0o077:  # made by an older version, 0644
            os.fchmod(fd, 0o600)
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
