"""The schema's revision, known without loading Alembic.

Loading Alembic and reading its script directory costs ~0.3 s, more than a command like
`steward sessions` may take in all. So the newest revision id is written down here, and a
database that already carries it opens without Alembic at all; only one that is behind (or
new) goes through `migrate`. `tests/test_cli_startup.py` keeps `HEAD` equal to the head
of `store/migrations/versions/`: a new migration fails that test until `HEAD` names it.
"""

HEAD = "0018"


async def current(engines) -> str | None:
    """The revision the database is at, or None (never migrated, or not a Steward one)."""
    from sqlalchemy import text

    async with engines.read.connect() as conn:
        try:
            row = (await conn.execute(text("SELECT version_num FROM alembic_version"))).first()
        except Exception:  # no table yet: a database never opened by Steward
            return None
        return row[0] if row else None


async def at_head(engines) -> bool:
    """Whether the database is at this build's newest revision (nothing to migrate)."""
    return await current(engines) == HEAD
