"""Making a file, or a directory's entries, survive a crash: one fsync, said once.

Every atomic write here (a snapshot, the vector index, a blob, a backup, an export) writes
a temporary name, syncs it, renames it into place and syncs the directory. A filesystem
that cannot sync a directory (some USB disks' FAT answer EINVAL) is left to sync it as it
does: the data itself was synced before the rename."""

import errno
import os
from pathlib import Path

_CANNOT_SYNC = (errno.EINVAL, errno.ENOTSUP, errno.EBADF)


def fsync_path(path: Path) -> None:
    """`path` (a file or a directory) on disk (blocking)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if not (path.is_dir() and exc.errno in _CANNOT_SYNC):
            raise
    finally:
        os.close(fd)
