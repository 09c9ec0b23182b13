"""Bytes stored once by their SHA-256 in the home directory: `<home>/blobs/ab/abcdef…`.

Content addressing makes every write idempotent: the same image shared twice is one file,
and a blob written by a step that then failed to commit is harmless (nothing refers to it,
and the next try finds it there). A blob is complete before anything may refer to it: it
is written to a temporary file, flushed to disk, and renamed into place (then the
directory is synced), so a crash leaves either no file or the whole one. Directories are
0700 and files 0600, like the rest of the home. Every call does its file work in a thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from pathlib import Path

from store.durable import fsync_path

DIGEST = re.compile(r"[0-9a-f]{64}")


class BlobStore:
    def __init__(self, root: Path):
        self.root = root

    @classmethod
    def of_home(cls, home: Path) -> BlobStore:
        return cls(home / "blobs")

    def path(self, digest: str) -> Path:
        """Where the blob `digest` lives (a ValueError for anything not a SHA-256)."""
        if not DIGEST.fullmatch(digest):
            raise ValueError(f"not a blob digest: {digest[:80]!r}")
        return self.root / digest[:2] / digest

    async def put(self, data: bytes) -> str:
        """Store `data` (durably, before this returns) and return its digest."""
        return await asyncio.to_thread(self._put, data)

    async def get(self, digest: str) -> bytes | None:
        """The blob's bytes, or None if it is missing or no longer matches its digest."""
        return await asyncio.to_thread(read_blob, self.path(digest), digest)

    def _put(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        final = self.path(digest)
        if read_blob(final, digest) is not None:
            return digest  # stored before (and whole): content addressing makes it the same
        _private_dir(self.root)
        _private_dir(final.parent)
        fd, temp = tempfile.mkstemp(dir=final.parent, prefix=".tmp-")  # 0600
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, final)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        fsync_path(final.parent)
        return digest


def read_blob(path: Path, digest: str) -> bytes | None:
    """Blocking read of one blob, checked against its digest (a damaged copy is None)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    return data if hashlib.sha256(data).hexdigest() == digest else None


def _private_dir(path: Path) -> None:
    if not path.is_dir():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        fsync_path(path.parent)  # the new directory entry survives a crash too
