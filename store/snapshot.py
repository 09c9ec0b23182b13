"""A snapshot of the database before its schema is migrated: an upgrade never leaves a home
without the database as it was.

`store.engine.migrate` takes one, under the migration lock, when a database that already
has a schema (fresh ones have nothing to keep) is about to move to a newer revision, and
refuses to migrate when it cannot (`SnapshotFailed`: nothing changed).

- SQLite: an online copy through SQLite's backup API (a thread; readers and the WAL go on),
  checked with `PRAGMA quick_check`, written as `<name>.partial` and renamed once complete
  and on disk, 0600.
- PostgreSQL: `pg_dump -Fc` (the store's schema only, when the URL names one; the password
  through PGPASSWORD, never on a command line). Without pg_dump the migration is refused
  with what to do: install it, or take a backup yourself and migrate with `steward db
  upgrade --no-snapshot`.

Files: `<dir>/steward-<from>-to-<to>-<UTC>.db` (SQLite) or `.dump` (PostgreSQL,
`pg_restore` reads it); the newest `KEEP` are kept.
"""

import logging
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from store.durable import fsync_path as _durable
from store.errors import SnapshotFailed

log = logging.getLogger(__name__)

KEEP = 5  # snapshots kept in the directory; older ones are removed after a new one
PREFIX = "steward-"
_SUFFIXES = (".db", ".dump")


def name(before: str, after: str, suffix: str, t: float | None = None) -> str:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if t is None else t))
    return f"{PREFIX}{before}-to-{after}-{stamp}{suffix}"


def take_sqlite(db: Path, directory: Path, before: str, after: str) -> Path:
    """Copy the SQLite database `db` into `directory` (blocking: run it in a thread)."""
    where = f"{directory}"
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        dest = _free_name(directory, before, after, ".db")
        _copy_sqlite(db, dest)
    except (OSError, sqlite3.Error) as exc:
        raise SnapshotFailed(_refusal(before, after, f"{where}: {_reason(exc)}")) from exc
    prune(directory)
    return dest


def take_postgres(url: str, search_path: str | None, directory: Path, before: str,
                  after: str) -> Path:
    """`pg_dump -Fc` of the database at `url` into `directory` (blocking)."""
    pg_dump = shutil.which("pg_dump")
    if pg_dump is None:
        raise SnapshotFailed(_refusal(
            before, after, "pg_dump is not installed (apt install postgresql-client, or "
            "your system's PostgreSQL client package)", own_backup=True))
    parsed = make_url(url)
    env = {**os.environ, "PGCONNECT_TIMEOUT": "30"}
    if parsed.password:
        env["PGPASSWORD"] = parsed.password
    query = dict(parsed.query)
    if "ssl" in query:  # asyncpg's spelling of libpq's sslmode
        query["sslmode"] = query.pop("ssl")
    dsn = parsed.set(drivername="postgresql", password=None, query=query).render_as_string(
        hide_password=False)
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        dest = _free_name(directory, before, after, ".dump")
        part = dest.with_name(dest.name + ".partial")
        args = [pg_dump, "-Fc", "--no-password", "-f", str(part)]
        for schema in (search_path or "").split(","):
            if schema.strip():
                args += ["-n", schema.strip()]
        done = subprocess.run([*args, "-d", dsn], env=env, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            part.unlink(missing_ok=True)
            said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
            raise SnapshotFailed(_refusal(before, after, said.removeprefix("pg_dump: "),
                                          own_backup=True))
        os.chmod(part, 0o600)
        _durable(part)
        os.replace(part, dest)
        _durable(directory)
    except OSError as exc:
        raise SnapshotFailed(_refusal(before, after, f"{directory}: {_reason(exc)}",
                                      own_backup=True)) from exc
    prune(directory)
    return dest


def prune(directory: Path, keep: int = KEEP) -> None:
    """Remove all but the newest `keep` snapshots (and partial copies left by a crash)."""
    try:
        found = [p for p in directory.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return
    for p in found:
        if p.name.endswith(".partial"):
            p.unlink(missing_ok=True)
    done = sorted((p for p in found if p.suffix in _SUFFIXES),
                  key=lambda p: (p.stat().st_mtime, p.name), reverse=True)
    for old in done[keep:]:
        try:
            old.unlink()
        except OSError as exc:
            log.warning("cannot remove the old snapshot %s: %s", old, exc)


def _refusal(before: str, after: str, why: str, *, own_backup: bool = False) -> str:
    how = ("install it, or back the database up yourself and then run `steward db upgrade "
           "--no-snapshot`" if own_backup else
           "free space there (or point [store] at a disk with room), or back the database "
           "up yourself and then run `steward db upgrade --no-snapshot`")
    return (f"cannot take a snapshot of the database before migrating it from {before} to "
            f"{after}, so it was not migrated (nothing changed): {why}; {how}")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f" ({exc.filename})" if exc.filename else "")
    return str(exc) or type(exc).__name__


def _free_name(directory: Path, before: str, after: str, suffix: str) -> Path:
    dest = directory / name(before, after, suffix)
    n = 1
    while dest.exists():  # two upgrades within a second
        n += 1
        dest = directory / name(before, after, f"-{n}{suffix}")
    return dest


def _copy_sqlite(db: Path, dest: Path) -> None:
    part = dest.with_name(dest.name + ".partial")
    os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    try:
        source = sqlite3.connect(db, timeout=30)
        try:
            target = sqlite3.connect(part)
            try:
                source.backup(target)  # every page in one step, from one read snapshot
                # The copy is one file: no -wal beside it, whatever mode the source is in.
                target.execute("PRAGMA journal_mode=DELETE")
                checked = [r[0] for r in target.execute("PRAGMA quick_check").fetchall()]
            finally:
                target.close()
        finally:
            source.close()
        if checked != ["ok"]:
            raise sqlite3.DatabaseError(f"the copy does not check out: {'; '.join(checked[:3])}")
        _durable(part)
        os.replace(part, dest)
        _durable(dest.parent)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
