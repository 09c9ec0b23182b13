"""A PostgreSQL backup's dump (bot/app/backup_db.py: `pg_dump --format=custom`) restored
into an empty database, for `steward restore BACKUP --home DIR --store-url URL`.

Only into an empty place, as the SQLite restore goes only into a new home: a database (or,
for a dump of one `?schema=`, that schema) that holds no table yet, never one a running
Steward may be writing. pg_restore runs in one transaction and stops at the first error,
so a restore that fails leaves the target as empty as it was. The dump of a `?schema=`
store recreates that schema under its own name; the restored home's URL names it.
pgvector lives outside a dumped schema (migration 0013 puts it in `public`): it is made
in the target first where it can be, as the migration does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sqlalchemy.engine import make_url

from bot.app.backup_db import DatabaseBackupError, find_pg_tool, pg_connection
from bot.config import StoreConfig


class RestoreTargetError(ValueError):
    """The target database cannot take the restore (one line why)."""


def restore_dump(dump: Path, store_url: str, schema: str | None) -> str:
    """Restore `dump` into the empty database of `store_url` (blocking); the URL the
    restored home uses. Raises RestoreError with one line."""
    from bot.app.errors import RestoreError

    try:  # the spellings [store] url takes (postgres://, postgresql://, +asyncpg)
        driver_url = StoreConfig(url=store_url).url
    except ValueError:
        driver_url = ""
    url = make_url(driver_url) if driver_url else None
    if url is None or url.get_backend_name() != "postgresql" or not url.database:
        raise RestoreError(f"--store-url must name a PostgreSQL database, not {store_url}")
    if url.query.get("schema") and url.query["schema"] != schema:
        raise RestoreError(f"this dump holds schema {schema or 'public'}: it is restored "
                           "under that name; leave ?schema= out of --store-url")
    where = pg_connection(driver_url)
    try:
        _check_empty(where, schema)
        _restore(find_pg_tool("pg_restore"), where, dump)
    except (RestoreTargetError, DatabaseBackupError) as exc:
        raise RestoreError(str(exc)) from None
    restored = url.set(drivername="postgresql+asyncpg")
    if schema:
        restored = restored.update_query_dict({"schema": schema})
    return restored.render_as_string(hide_password=False)


def _psql_env(where: dict) -> dict:
    env = dict(os.environ)
    if where["password"]:
        env["PGPASSWORD"] = where["password"]  # never on the command line
    return env


def _connect_args(where: dict) -> list[str]:
    return ["--host", where["host"], "--port", str(where["port"]), "--username", where["user"],
            "--no-password"]


def _check_empty(where: dict, schema: str | None) -> None:
    """Refuse a target that holds a table where the dump's would go."""
    import asyncio

    import asyncpg

    async def tables() -> int:
        conn = await asyncpg.connect(host=where["host"], port=where["port"],
                                     user=where["user"], password=where["password"],
                                     database=where["database"], timeout=30)
        try:
            found = await conn.fetchval(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1",
                schema or "public")
            try:  # the dump's tables may use pgvector's type: made here first if it can be
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
            except asyncpg.PostgresError:
                pass  # no pgvector: the dump restores without it if it never used it
            return found
        finally:
            await conn.close()

    try:
        found = asyncio.run(tables())
    except (OSError, asyncpg.PostgresError) as exc:
        raise RestoreTargetError(f"cannot open {where['database']} on {where['host']}: "
                                 f"{exc}") from None
    if found:
        raise RestoreTargetError(
            f"{where['database']} is not empty ({found} tables in schema "
            f"{schema or 'public'}): a backup is restored into an empty database only "
            "(createdb a new one), never over one that may be running")


def _restore(tool: str, where: dict, dump: Path) -> None:
    done = subprocess.run(
        [tool, *_connect_args(where), "--dbname", where["database"], "--no-owner",
         "--no-privileges", "--single-transaction", "--exit-on-error", str(dump)],
        env=_psql_env(where), capture_output=True, stdin=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        said = [line for line in done.stderr.decode(errors="replace").splitlines()
                if line.strip()]
        raise RestoreTargetError(f"pg_restore failed (exit {done.returncode}): "
                                 f"{said[-1] if said else 'no message'}; the database is "
                                 "left as it was")
