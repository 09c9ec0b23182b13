"""The database's part of a backup (bot/app/backup.py): one consistent copy, taken while
Steward keeps writing, and where it stands.

SQLite: the online backup API (`sqlite3.Connection.backup`) in one step, i.e. under one
read transaction. In WAL mode a reader never blocks the writer, so `steward run` goes on
committing while the pages are copied; a copy made in several steps would start over
each time another connection commits, which under a steady load may be forever. The copy
is switched out of WAL (one self-contained file), checked with `PRAGMA integrity_check`,
and its position read from it. Blocking: call it in a thread.

PostgreSQL: `pg_dump --format=custom` of a snapshot exported by a read-only repeatable-read
transaction, which also reads the position, so the position is exactly the dump's. The
URL's `?schema=` (Steward's own extension) dumps that schema alone. pg_dump is `[backup]
pg_dump`, else the one on PATH, else the newest under /usr/lib/postgresql/*/bin; it must be
at least as new as the server.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from sqlalchemy.engine import make_url

# Where the database stands: read from the copy (or the dump's own snapshot).
_POSITION = {
    "revision": "SELECT version_num FROM alembic_version",
    "max_entry_id": "SELECT max(id) FROM entries",
    "entries": "SELECT count(*) FROM entries",
    "max_submission_id": "SELECT max(id) FROM submissions",
    "conversations": "SELECT count(*) FROM conversations",
}


class DatabaseBackupError(ValueError):
    """The database could not be copied (one line, saying what to do)."""


# -- SQLite ------------------------------------------------------------------------------


def sqlite_path(store_url: str) -> Path | None:
    """The SQLite file of this store URL, or None for PostgreSQL."""
    url = make_url(store_url)
    return Path(url.database or "") if url.get_backend_name() == "sqlite" else None


def snapshot_sqlite(source: Path, target: Path) -> tuple[float, dict]:
    """Copy the database `source` to the new file `target`, check the copy; (the time the
    copy was taken, its position). Raises DatabaseBackupError."""
    if not source.is_file():
        raise DatabaseBackupError(f"no database at {source}: nothing to back up yet "
                                  "(it is made at the first start)")
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    try:  # mode=rw: never create a database that is not there
        src = sqlite3.connect(f"file:{quote(str(source))}?mode=rw", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise DatabaseBackupError(f"cannot open {source}: {exc}") from None
    dst = sqlite3.connect(target, isolation_level=None)
    try:
        src.execute("PRAGMA busy_timeout=30000")
        src.execute("PRAGMA query_only=ON")
        taken_at = time.time()
        src.backup(dst)  # pages=-1: all of it under one read transaction
        dst.execute("PRAGMA journal_mode=DELETE")  # one file, no -wal beside it
        problems = [row[0] for row in dst.execute("PRAGMA integrity_check")]
        if problems != ["ok"]:
            raise DatabaseBackupError(f"the copy of {source} fails its integrity check: "
                                      f"{'; '.join(problems[:3])}; the database itself is "
                                      "damaged (`steward doctor` says how to recover it)")
        return taken_at, sqlite_position(dst)
    except sqlite3.Error as exc:
        raise DatabaseBackupError(f"copying {source}: {exc}") from None
    finally:
        dst.close()
        src.close()


def sqlite_position(conn: sqlite3.Connection) -> dict:
    found = {}
    for key, sql in _POSITION.items():
        try:
            found[key] = conn.execute(sql).fetchone()[0]
        except sqlite3.OperationalError:  # no such table: never opened by Steward
            found[key] = None
    return found


def check_sqlite(path: Path) -> list[str]:
    """What `PRAGMA integrity_check` says of a backed-up copy (["ok"] when whole), opened
    read-only and immutable (nothing is written beside it)."""
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro&immutable=1", uri=True)
    try:
        return [row[0] for row in conn.execute("PRAGMA integrity_check")]
    except sqlite3.DatabaseError as exc:  # "file is not a database"
        return [str(exc)]
    finally:
        conn.close()


# -- PostgreSQL --------------------------------------------------------------------------


def find_pg_tool(name: str, configured: str = "") -> str:
    """The path of `pg_dump` (or `pg_restore`, found beside a configured pg_dump)."""
    if configured:
        beside = Path(configured).with_name(name)
        path = configured if name == "pg_dump" else str(beside)
        if os.access(path, os.X_OK) and Path(path).is_file():
            return path
        raise DatabaseBackupError(f"{name} not found at {path} ([backup] pg_dump): "
                                  "point it at an installed pg_dump")
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: [int(n) for n in re.findall(r"\d+", p)])
    if versions:
        return versions[-1]
    raise DatabaseBackupError(f"{name} not found: backing up PostgreSQL needs the client "
                              "tools (Debian/Ubuntu: apt install postgresql-client), as new as "
                              "the server; or set [backup] pg_dump to its path")


def pg_connection(store_url: str) -> dict:
    url = make_url(store_url)
    query = dict(url.query)
    host = url.host or query.get("host") or "localhost"
    return {"host": host, "port": url.port or int(query.get("port") or 5432),
            "user": url.username or os.environ.get("PGUSER") or os.environ.get("USER", ""),
            "password": url.password, "database": url.database or "",
            "schema": query.get("schema")}


async def snapshot_postgres(store_url: str, target: Path, pg_dump: str = "") -> tuple[float, dict]:
    """Dump the database into `target` (custom format); (the snapshot's time, its
    position). Raises DatabaseBackupError."""
    import asyncpg

    tool = find_pg_tool("pg_dump", pg_dump)
    c = pg_connection(store_url)
    settings = {"search_path": c["schema"]} if c["schema"] else {}
    # a server that cannot be reached is the CLI's database error, as for every command
    conn = await asyncpg.connect(host=c["host"], port=c["port"], user=c["user"],
                                 password=c["password"], database=c["database"],
                                 server_settings=settings, timeout=30)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            snapshot = await conn.fetchval("SELECT pg_export_snapshot()")
            taken_at = time.time()
            position = {}
            for key, sql in _POSITION.items():
                try:
                    async with conn.transaction():  # a savepoint: a missing table is None
                        position[key] = await conn.fetchval(sql)
                except asyncpg.UndefinedTableError:
                    position[key] = None
            await _pg_dump(tool, c, snapshot, target)
        position["schema"] = c["schema"]
        return taken_at, position
    finally:
        await conn.close()


async def _pg_dump(tool: str, c: dict, snapshot: str, target: Path) -> None:
    args = [tool, "--format=custom", f"--snapshot={snapshot}", "--no-password",
            "--host", c["host"], "--port", str(c["port"]), "--username", c["user"],
            "--dbname", c["database"], "--file", str(target)]
    if c["schema"]:
        args += ["--schema", c["schema"]]
    env = dict(os.environ)
    if c["password"]:
        env["PGPASSWORD"] = c["password"]  # never on the command line
    proc = await asyncio.create_subprocess_exec(*args, env=env,
                                                stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # cancelled: no dump left running
            proc.kill()
            await proc.wait()
    if proc.returncode != 0:
        said = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        hint = ("; use a pg_dump at least as new as the server ([backup] pg_dump)"
                if any("version mismatch" in line for line in said) else "")
        raise DatabaseBackupError(f"pg_dump failed (exit {proc.returncode}): "
                                  f"{said[-1] if said else 'no message'}{hint}")
    os.chmod(target, 0o600)


def check_pg_dump(path: Path, pg_dump: str = "") -> str | None:
    """What is wrong with a dump (`pg_restore --list` cannot read it), None if it reads, or
    None too when no pg_restore is installed (blocking)."""
    import subprocess

    try:
        tool = find_pg_tool("pg_restore", pg_dump)
    except DatabaseBackupError:
        return None
    done = subprocess.run([tool, "--list", str(path)], capture_output=True, check=False)
    if done.returncode == 0:
        return None
    said = [line for line in done.stderr.decode(errors="replace").splitlines() if line]
    return f"pg_restore cannot read it: {said[-1] if said else f'exit {done.returncode}'}"
