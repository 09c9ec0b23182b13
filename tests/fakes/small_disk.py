"""A file system that fills up, for the fault tests: a tmpfs of the test's own, mounted
for the test and unmounted after (the tests run as root, as CI does), and `fill`, which
takes every free byte of it with a ballast file until the test deletes it."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def mounted(size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount takes it: "64k", "48m") at a new directory."""
    where = Path(tempfile.mkdtemp(prefix="steward-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                    str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        shutil.rmtree(where, ignore_errors=True)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` with a ballast file, down to the last; returns it."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 16384, 4096, 512, 1):
            chunk = b"\0" * size
            while True:
                try:
                    os.write(fd, chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    finally:
        os.close(fd)
    return ballast
