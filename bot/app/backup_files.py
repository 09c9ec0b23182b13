"""The files of a backup (bot/app/backup.py): each written once, fsynced, its size and
SHA-256 recorded as it is written, optionally encrypted with age; and read back later to
check them against the manifest. Blocking: the caller runs this in a thread.

A blob (content-addressed: never changed in place) that the previous backup in the same
directory holds is a hard link to that copy, so keeping seven backups of a large blob
store does not take seven times its space; never a link into the home, whose files a
backup must not share. Whatever is written is dropped from the page cache after its
fsync, so checking it reads the disk, not memory.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
from pathlib import Path, PurePosixPath

from store.durable import fsync_path

CHUNK = 1 << 20
AGE = ".age"


class Stopped(Exception):
    """The backup was asked to stop (the process is shutting down)."""


class Sealer:
    """Encrypts every file of a backup with age to `recipients` ("age1..." or ssh keys),
    and, with a passphrase, also to a key made for this backup, stored in the backup
    encrypted with the passphrase (age's scrypt): a passphrase costs one scrypt per
    backup, not one per file, and every file is streamed."""

    def __init__(self, recipients: list[str], passphrase: str | None):
        from pyrage import passphrase as by_passphrase
        from pyrage import ssh, x25519

        self.configured = list(recipients)
        self.recipients = [ssh.Recipient.from_str(r) if r.startswith("ssh-")
                           else x25519.Recipient.from_str(r) for r in recipients]
        self.passphrase_key: bytes | None = None
        if passphrase:
            identity = x25519.Identity.generate()
            self.recipients.append(identity.to_public())
            self.passphrase_key = by_passphrase.encrypt(str(identity).encode(), passphrase)

    def seal(self, source, target) -> None:
        import pyrage

        pyrage.encrypt_io(source, target, self.recipients)


class _Hashing:
    """A file object that hashes and counts what goes through it."""

    def __init__(self, file):
        self.file, self.sha, self.size = file, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.file.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def digest(path: Path, stop: threading.Event | None = None) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in chunks."""
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            if stop is not None and stop.is_set():
                raise Stopped
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()


def _settle(fd: int) -> None:
    """On disk, and out of the page cache (a check then reads what the disk holds)."""
    os.fsync(fd)
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


sync_dir = fsync_path  # a directory's entries on disk (store/durable.py)


class Files:
    """The files written into one backup directory `root`, for its manifest."""

    def __init__(self, root: Path, sealer: Sealer | None, stop: threading.Event):
        self.root, self.sealer, self.stop = root, sealer, stop
        self.files: list[dict] = []
        self.skipped: list[dict] = []
        self._dirs: set[Path] = {root}
        self.linked = 0

    def target(self, rel: str) -> Path:
        if self.stop.is_set():
            raise Stopped
        target = self.root / (rel + (AGE if self.sealer else ""))
        for parent in reversed(target.relative_to(self.root).parents[:-1]):
            folder = self.root / parent
            if folder not in self._dirs:
                folder.mkdir(mode=0o700, exist_ok=True)
                self._dirs.add(folder)
        return target

    def _record(self, target: Path, size: int, sha: str, plain: tuple[int, str] | None) -> dict:
        entry = {"path": target.relative_to(self.root).as_posix(), "size": size, "sha256": sha}
        if plain is not None:
            entry["plain_size"], entry["plain_sha256"] = plain
        self.files.append(entry)
        return entry

    def add(self, source: Path, rel: str, *, whole_lines: bool = False) -> dict:
        """Copy (or encrypt) `source` as `rel`. `whole_lines`: a journal still being
        appended to is cut after its last complete line (a torn line was not acked)."""
        target = self.target(rel)
        with open(source, "rb") as f:
            if whole_lines:
                data = f.read()
                f = io.BytesIO(data[:data.rfind(b"\n") + 1])
            return self._write(f, target)

    def _write(self, source, target: Path) -> dict:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb", closefd=False) as out:
                written = _Hashing(out)
                if self.sealer is not None:
                    read = _Hashing(source)
                    self.sealer.seal(read, written)
                    plain = (read.size, read.sha.hexdigest())
                else:
                    while chunk := source.read(CHUNK):
                        if self.stop.is_set():
                            raise Stopped
                        written.write(chunk)
                    plain = None
            _settle(fd)
        except BaseException:
            os.close(fd)
            target.unlink(missing_ok=True)
            raise
        os.close(fd)
        return self._record(target, written.size, written.sha.hexdigest(), plain)

    def adopt(self, rel: str) -> dict:
        """A file already written at `rel` (plain) by someone else: settle and record it."""
        target = self.target(rel)
        fd = os.open(target, os.O_RDONLY)
        try:
            _settle(fd)
        finally:
            os.close(fd)
        return self._record(target, *digest(target, self.stop), None)

    def blob(self, source: Path, rel: str, name: str, earlier: Path | None) -> None:
        """A content-addressed file whose SHA-256 is `name`: a link to `earlier` (the
        same blob in the previous backup, plain) when that is whole, else a copy. One whose
        bytes no longer match its name is damaged: left out, and said so."""
        target = self.target(rel)
        if earlier is not None and self.sealer is None:
            try:
                os.link(earlier, target)
                size, sha = digest(target, self.stop)
                if sha == name:
                    self._record(target, size, sha, None)
                    self.linked += 1
                    return
                target.unlink()  # that copy is damaged: copy the home's
            except OSError:  # rotated away meanwhile; no hard links there (FAT), too many
                target.unlink(missing_ok=True)
        try:
            with open(source, "rb") as f:
                entry = self._write(f, target)
        except FileNotFoundError:  # forgotten meanwhile
            return
        if entry.get("plain_sha256", entry["sha256"]) != name:
            self.files.pop()
            target.unlink()
            self.skipped.append({"path": rel, "reason": "damaged in the home: its bytes do "
                                 "not match its name"})

    def write_bytes(self, rel: str, data: bytes) -> dict:
        """A small file of its own (never encrypted: the manifest, the passphrase key)."""
        target = self.root / rel
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, data)
            _settle(fd)
        finally:
            os.close(fd)
        return {"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def sync(self) -> None:
        """Every directory made, on disk (deepest first)."""
        for folder in sorted(self._dirs, key=lambda p: len(p.parts), reverse=True):
            sync_dir(folder)


def safe_path(rel: object) -> bool:
    """A manifest's path stays inside the backup: relative, no `..`."""
    if not isinstance(rel, str) or not rel or "\\" in rel:
        return False
    path = PurePosixPath(rel)
    return not path.is_absolute() and ".." not in path.parts


def check_files(root: Path, files: list, stop: threading.Event | None = None) -> list[str]:
    """What differs between the files under `root` and the manifest's list of them."""
    problems = []
    for entry in files:
        rel = entry.get("path") if isinstance(entry, dict) else None
        if not safe_path(rel):
            problems.append(f"the manifest lists a path outside the backup: {rel!r}")
            continue
        path = root / rel
        try:
            size, sha = digest(path, stop)
        except FileNotFoundError:
            problems.append(f"{rel}: missing")
            continue
        except OSError as exc:
            problems.append(f"{rel}: cannot be read ({exc.strerror or exc})")
            continue
        if size != entry.get("size"):
            problems.append(f"{rel}: {size} bytes, the manifest says {entry.get('size')}")
        elif sha != entry.get("sha256"):
            problems.append(f"{rel}: its SHA-256 differs from the manifest's (damaged)")
    return problems
