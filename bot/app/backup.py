"""`steward backup`: an online, verified snapshot of everything that makes a home, taken
while `steward run` keeps answering; `[backup]` (bot/app/backup_config.py) schedules it
(bot/app/backup_schedule.py).

A backup is one directory, `DIR/steward-backup-<UTC time>/` (`steward-backup-
20250102T030405Z`, `-2`, `-3`... if that second is taken), written as the hidden
`DIR/.steward-backup-<UTC time>.partial/`, every file and directory fsynced, checked, then
renamed into place: a directory with the right name is whole and was verified. In it::

    manifest.json                 what is below, and where the database stood
    database/steward.db           SQLite: the online-backup copy, not in WAL mode, checked
    database/steward.pgdump       PostgreSQL instead: `pg_dump --format=custom`
    home/<path>                   the home's own files, by their path in it: the Slack
                                  inbox journal `slack-inbox.jsonl`, the attachment blobs
                                  `blobs/ab/<sha256>`, any other side file; config.toml if
                                  it lives there
    config/<name>                 the config file in use, when it is outside the home
    passphrase-key.age            with a passphrase only (see `encryption`)

Left out: the SQLite files themselves (copied through the API instead: `steward.db`, its
`-wal`, `-shm`, `-journal`), the vector index `<database>-vectors/` (rebuilt from the
`entry_vectors` table), the database's `.state` note, the pre-upgrade copies in
`snapshots/`, `runner.lock`, `run.lock`, `health.json`, `config.validated.json`,
`steward.log`, scratch files (`.*.tmp`), and backup directories (any holding a
`.steward-backup.lock`). The environment file of secrets (`~/.config/steward/env`) is
never copied: secrets stay where they are kept.

Order: the home's side files first, then the database, then the blobs. The Slack journal's
`done` line for an event is written after the event's commit, so a journal copied before
the database never says done for a message the copy lacks (what it holds as pending is
taken in again, deduplicated); a blob is stored before any entry refers to it, so blobs
copied after the database hold every one the copy refers to.

`manifest.json` (format 1)::

    {"format": "steward-backup", "version": 1,
     "name": "steward-backup-20250102T030405Z",
     "taken_at": "2025-01-02T03:04:05.123456Z",   # UTC: when the database copy began
     "finished_at": "...Z", "steward_version": "0.1.0",
     "source": {"home": "/abs/home", "host": "name", "config": "/abs/config.toml" | null},
     "database": {"kind": "sqlite" | "postgresql",
                  "file": "database/steward.db",  # as listed in "files"
                  "revision": "0016",             # alembic; null: never migrated
                  "max_entry_id": 1234, "entries": 1234, "max_submission_id": 321,
                  "conversations": 12,            # all as of the copy (null: no table)
                  "schema": null,                 # PostgreSQL: the URL's ?schema=, if any
                  "check": "integrity_check ok"}, # or "pg_restore --list ok"/"not checked"
     "encryption": null | {"scheme": "age", "recipients": ["age1..."],
                           "passphrase_key": "passphrase-key.age" | null},
     "files": [{"path": "database/steward.db", "size": 4096, "sha256": "<hex>"}, ...],
     "skipped": [{"path": "home/blobs/ab/...", "reason": "..."}]}

`files` lists every file but manifest.json, paths relative to the backup, "/"-separated.
`size` and `sha256` are of the bytes as stored. Encrypted, every file but the passphrase
key is stored as `<path>.age` (the listed path ends in .age) and also carries `plain_size`
and `plain_sha256`, of what it decrypts to.

Restoring (`steward restore`): `verify_backup(path)` first (it raises `Damaged` naming
each bad file). Then, per file: strip a trailing `.age` after decrypting (age identity:
the recipient's own key, or with `passphrase_key`: that file decrypted with the passphrase
is the identity, `pyrage.passphrase.decrypt` then `x25519.Identity.from_str`), and check
`plain_sha256`; `database/steward.db` becomes the new home's SQLite database as it is (it
opens in WAL at the first start), `database/steward.pgdump` goes to `pg_restore` (into
the URL's schema if `schema` is set), `home/<path>` to `<new home>/<path>` (copy, or link:
blobs are never changed in place), `config/<name>` wherever the new config belongs.
`skipped` files were not in the backup (say so). Nothing in a backup is ever changed.

Rotation (`[backup] keep`) deletes only directories named like ours whose manifest.json
says `"format": "steward-backup"`, oldest first, in the configured directory only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bot.app.backup_config import backup_dir
from bot.app.backup_db import (
    check_pg_dump,
    check_sqlite,
    snapshot_postgres,
    snapshot_sqlite,
    sqlite_path,
)
from bot.app.backup_files import Files, Sealer, Stopped, check_files, sync_dir
from bot.attachments.blobs import DIGEST as DIGEST_NAME

log = logging.getLogger(__name__)

FORMAT = "steward-backup"
VERSION = 1
MANIFEST = "manifest.json"
PASSPHRASE_KEY = "passphrase-key.age"
LOCK = ".steward-backup.lock"
FAILED = ".steward-backup-failed.json"  # the last attempt's error, until one succeeds
STAGE = ".steward-stage-"  # an encrypted backup's plain database, staged in the home
_NAME = re.compile(r"steward-backup-(\d{8}T\d{6}Z)(?:-(\d+))?")
_PARTIAL = re.compile(r"\.steward-backup-.*\.partial")
_LEFT_OUT = ("runner.lock", "run.lock", "health.json", "config.validated.json", "steward.log")
# Beside the SQLite file: its own (copied through the API), the vector index (rebuilt from
# the table) and the note of how far it got (store/wal_guard.py: about that file only).
_DB_COMPANIONS = ("-wal", "-shm", "-journal", "-vectors", ".state")


class BackupError(ValueError):
    """A backup could not be made or read (one line)."""


class Damaged(BackupError):
    """A backup that fails verification; `problems` names each bad file."""

    def __init__(self, path: Path, problems: list[str]):
        self.path, self.problems = path, problems
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"backup {path} is damaged: {problems[0]}{more}")


@dataclass
class Made:
    path: Path
    manifest: dict
    seconds: float
    linked: int  # blobs hard-linked rather than copied
    removed: list[Path]  # older backups rotation deleted


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _where(exc: OSError) -> str:
    return f" ({exc.filename})" if exc.filename else ""


def _version() -> str:
    from bot.app.installed import version

    return version()


# -- reading backups ---------------------------------------------------------------------


def read_manifest(path: Path) -> dict | None:
    """The manifest of a backup Steward made, or None (not one, or unreadable)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(manifest, dict) and manifest.get("format") == FORMAT \
        and isinstance(manifest.get("files"), list) and isinstance(manifest.get("taken_at"), str)
    return manifest if ok else None


def _names(where: Path) -> list[str]:
    """Names of directories in `where` named like a backup, newest first."""
    try:
        names = [e.name for e in os.scandir(where)
                 if _NAME.fullmatch(e.name) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return []

    def order(name: str) -> tuple[str, int]:
        found = _NAME.fullmatch(name)
        return found.group(1), int(found.group(2) or 1)
    return sorted(names, key=order, reverse=True)


def list_backups(where: Path) -> list[tuple[Path, dict]]:
    """The backups Steward made in `where`, newest first (blocking)."""
    return [(where / name, manifest) for name in _names(where)
            if (manifest := read_manifest(where / name)) is not None]


def newest_backup(where: Path) -> tuple[Path, dict] | None:
    """The newest backup Steward made in `where`, or None (blocking)."""
    for name in _names(where):
        if (manifest := read_manifest(where / name)) is not None:
            return where / name, manifest
    return None


def last_failure(where: Path) -> dict | None:
    """{"at", "error"} of the last attempt in `where` if it failed (removed when one
    succeeds), else None."""
    try:
        failed = json.loads((where / FAILED).read_text())
        return failed if isinstance(failed, dict) and "at" in failed else None
    except (OSError, ValueError):
        return None


def verify_backup(path: Path, *, deep: bool = True, pg_dump: str = "",
                  stop: threading.Event | None = None) -> dict:
    """Check a backup against its manifest (every file's size and SHA-256; `deep`: the
    database copy's own check too); its manifest, or `Damaged` (blocking)."""
    manifest = read_manifest(path)
    if manifest is None:
        why = "missing" if not (path / MANIFEST).exists() else "unreadable"
        raise Damaged(path, [f"{MANIFEST} is {why}: not a Steward backup, or damaged"])
    if manifest.get("version") != VERSION:
        raise BackupError(f"backup {path} has format version {manifest.get('version')}; "
                          f"this Steward reads {VERSION}: use a newer one")
    problems = check_files(path, manifest["files"], stop)
    database = manifest.get("database") or {}
    listed = {f.get("path") for f in manifest["files"] if isinstance(f, dict)}
    if database.get("file") not in listed:
        problems.append(f"the database file {database.get('file')!r} is not listed")
    elif deep and not problems and manifest.get("encryption") is None:
        db = path / database["file"]
        if database.get("kind") == "sqlite":
            said = check_sqlite(db)
            if said != ["ok"]:
                problems.append(f"{database['file']}: integrity check: {'; '.join(said[:3])}")
        elif (said := check_pg_dump(db, pg_dump)) is not None:
            problems.append(f"{database['file']}: {said}")
    if problems:
        raise Damaged(path, problems)
    return manifest


def rotate(where: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` backups Steward made in `where` (blocking)."""
    removed = []
    for path, _ in list_backups(where)[keep:]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


# -- making one --------------------------------------------------------------------------


async def take_backup(config, to: Path | None = None) -> Made:
    """Back the home of `config` up into `to` (default `[backup] dir`), verify it, and in
    the configured directory delete all but `[backup] keep`. Raises BackupError."""
    target = (to or backup_dir(config)).expanduser().absolute()
    job = _Job(config, target, rotate=target == backup_dir(config).expanduser().absolute())
    return await job.run()


class _Job:
    def __init__(self, config, target: Path, *, rotate: bool):
        self.config, self.target, self.rotate = config, target, rotate
        self.home = Path(config.home).absolute()
        self.db = sqlite_path(config.store_url)
        self.stop = threading.Event()
        self.lock_fd: int | None = None
        self.work: Path | None = None
        self.stage: Path | None = None
        self.files: Files | None = None
        self.database: dict = {}
        self.taken_at = 0.0
        self._step: asyncio.Future | None = None
        self.sealer: Sealer | None = None  # made in `_begin`: a passphrase costs a scrypt

    async def _thread(self, fn):
        """`fn` in a thread; its file errors said as where the backup failed."""
        self._step = asyncio.ensure_future(asyncio.to_thread(fn))
        try:
            return await asyncio.shield(self._step)
        except OSError as exc:
            raise BackupError(f"backup into {self.target} failed: "
                              f"{exc.strerror or exc}{_where(exc)}") from exc

    async def run(self) -> Made:
        started = time.monotonic()
        try:
            await self._thread(self._begin)
            await self._database()
            path, removed = await self._thread(self._finish)
        except BaseException as exc:
            self.stop.set()
            if self._step is not None and not self._step.done():
                await asyncio.wait([self._step])  # the thread stops at its next file
            await asyncio.to_thread(self._abandon, exc)
            raise
        return Made(path, self.manifest, round(time.monotonic() - started, 3),
                    self.files.linked, removed)

    # -- in a thread --

    def _begin(self) -> None:
        section = self.config.backup
        passphrase = self.config.secret(section.passphrase_env) \
            if section.passphrase_env else None
        if section.recipients or passphrase:
            self.sealer = Sealer(section.recipients, passphrase)
        self.target.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.lock_fd = os.open(self.target / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        while True:  # another backup into this directory finishes first
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if self.stop.wait(0.2):
                    raise Stopped from None
        for entry in os.scandir(self.target):  # what a killed backup left (we hold the lock)
            if _PARTIAL.fullmatch(entry.name):
                shutil.rmtree(entry.path, ignore_errors=True)
        self._clear_stages()
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.name = f"steward-backup-{stamp}"
        taken = [int(found.group(2) or 1) for name in _names(self.target)
                 if (found := _NAME.fullmatch(name)).group(1) == stamp]
        if taken:  # the same second: after every one of them, in name order too
            self.name += f"-{max(taken) + 1}"
        self.work = self.target / f".{self.name}.partial"
        self.work.mkdir(mode=0o700)
        self.files = Files(self.work, self.sealer, self.stop)
        self._side_files()

    def _left_out(self) -> set[str]:
        """Real paths not copied from the home (besides `_LEFT_OUT` and scratch files)."""
        paths = {self.home / "blobs", self.home / "snapshots", self.target,
                 backup_dir(self.config)}
        if self.db is not None:
            paths |= {self.db, *(Path(f"{self.db}{s}") for s in _DB_COMPANIONS)}
        return {os.path.realpath(p) for p in paths}

    def _side_files(self) -> None:
        left_out = self._left_out()
        for folder, dirs, names in os.walk(self.home):
            here = Path(folder)
            dirs[:] = [d for d in dirs if os.path.realpath(here / d) not in left_out
                       and not d.startswith((STAGE, ".steward-backup-"))
                       and not (here / d / LOCK).exists()]
            for name in names:
                path = here / name
                if (here == self.home and name in _LEFT_OUT) or os.path.realpath(path) \
                        in left_out or (name.startswith(".") and name.endswith(".tmp")):
                    continue
                if not path.is_file() or path.is_symlink():
                    continue
                rel = f"home/{path.relative_to(self.home).as_posix()}"
                try:
                    self.files.add(path, rel, whole_lines=name.endswith(".jsonl"))
                except FileNotFoundError:  # gone meanwhile (a scratch file renamed)
                    continue
                except PermissionError as exc:  # not the owner's to read: said, not fatal
                    self.files.skipped.append({"path": rel, "reason": exc.strerror})
        config_file = self.config.path
        if config_file is not None and not Path(config_file).absolute().is_relative_to(self.home):
            self.files.add(Path(config_file), f"config/{Path(config_file).name}")

    def _clear_stages(self) -> None:
        """Staging directories in the home whose process is gone."""
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.home):
                if entry.name.startswith(STAGE):
                    pid = entry.name[len(STAGE):].split("-")[0]
                    try:
                        os.kill(int(pid), 0)
                    except (ProcessLookupError, ValueError):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    except PermissionError:
                        pass

    def _finish(self) -> tuple[Path, list[Path]]:
        self._blobs()
        files = self.files
        if self.sealer is not None and self.sealer.passphrase_key is not None:
            files.files.append(files.write_bytes(PASSPHRASE_KEY, self.sealer.passphrase_key))
        self.manifest = self._manifest()
        files.write_bytes(MANIFEST, json.dumps(self.manifest, indent=1).encode())
        files.sync()
        problems = check_files(self.work, files.files, self.stop)
        if problems:
            raise Damaged(self.work, problems)
        final = self.target / self.name
        os.rename(self.work, final)
        sync_dir(self.target)
        with contextlib.suppress(FileNotFoundError):
            (self.target / FAILED).unlink()
        removed = rotate(self.target, self.config.backup.keep) if self.rotate else []
        self._unlock()
        return final, removed

    def _blobs(self) -> None:
        root = self.home / "blobs"
        if not root.is_dir():
            return
        earlier = newest_backup(self.target)
        previous = None if earlier is None or earlier[1].get("encryption") else earlier[0]
        for shard in sorted(os.scandir(root), key=lambda e: e.name):
            if not shard.is_dir(follow_symlinks=False):
                continue
            for entry in sorted(os.scandir(shard.path), key=lambda e: e.name):
                if not DIGEST_NAME.fullmatch(entry.name) or entry.is_symlink():
                    continue  # a scratch file being written (.tmp-...)
                rel = f"home/blobs/{shard.name}/{entry.name}"
                before = previous / rel if previous is not None else None
                self.files.blob(Path(entry.path), rel, entry.name,
                                before if before is not None and before.is_file() else None)

    def _manifest(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "name": self.name,
            "taken_at": _iso(self.taken_at), "finished_at": _iso(time.time()),
            "steward_version": _version(),
            "source": {"home": str(self.home), "host": socket.gethostname(),
                       "config": str(self.config.path) if self.config.path else None},
            "database": self.database,
            "encryption": None if self.sealer is None else {
                "scheme": "age", "recipients": self.sealer.configured,
                "passphrase_key": PASSPHRASE_KEY if self.sealer.passphrase_key else None},
            "files": self.files.files,
            "skipped": self.files.skipped,
        }

    def _abandon(self, exc: BaseException) -> None:
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
        if not isinstance(exc, Stopped | asyncio.CancelledError | KeyboardInterrupt) \
                and self.target.is_dir():
            with contextlib.suppress(OSError):
                (self.target / FAILED).write_text(json.dumps(
                    {"at": _iso(time.time()), "error": " ".join(str(exc).split())[:500]}))
        self._unlock()

    def _unlock(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # the flock goes with it
            self.lock_fd = None

    # -- the database --

    async def _database(self) -> None:
        sqlite = self.db is not None
        name = "steward.db" if sqlite else "steward.pgdump"
        rel = f"database/{name}"
        if self.sealer is None:  # straight into the backup
            plain = await self._thread(lambda: self.files.target(rel))  # makes database/
        else:  # the plain copy stays on the home's disk until it is encrypted
            self.stage = Path(await self._thread(lambda: tempfile.mkdtemp(
                prefix=f"{STAGE}{os.getpid()}-", dir=self.home)))
            plain = self.stage / name
        if sqlite:
            self.taken_at, position = await self._thread(lambda: snapshot_sqlite(self.db, plain))
            check = "integrity_check ok"
        else:
            pg_dump = self.config.backup.pg_dump
            self.taken_at, position = await snapshot_postgres(self.config.store_url, plain,
                                                              pg_dump)
            said = await self._thread(lambda: check_pg_dump(plain, pg_dump))
            if said is not None:
                raise BackupError(f"the dump just made is not readable: {said}")
            check = "pg_restore --list ok"
        entry = await self._thread(lambda: self.files.adopt(rel) if self.sealer is None
                                   else self._seal_stage(plain, rel))
        self.database = {"kind": "sqlite" if sqlite else "postgresql", "file": entry["path"],
                         **position, "check": check}
        self.database.setdefault("schema", None)

    def _seal_stage(self, plain: Path, rel: str) -> dict:
        try:
            return self.files.add(plain, rel)
        finally:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None
