"""A runner lock in the home directory: the process holding it knows it is the only
runner on an SQLite store, so on start it may resume every `running` task at once instead
of waiting for their leases to expire."""

import fcntl
import os
from pathlib import Path


class RunnerLock:
    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        """Non-blocking; False if another live process holds it. The kernel drops the lock
        when its holder dies, however it dies."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
