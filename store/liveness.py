"""Which workers are alive, on PostgreSQL: each runner holds a session advisory lock named
after its owner id for as long as its process lives; the server drops it the moment the
connection dies, however the process died. A lock that can be taken belongs to a dead
worker, whose running tasks can be resumed at once instead of after their lease expires.
(On SQLite the runner lock file in the home directory plays this part.)"""

import hashlib

from sqlalchemy import text


def lock_key(owner: str) -> int:
    return int.from_bytes(hashlib.blake2b(owner.encode(), digest_size=8).digest(), "big",
                          signed=True)


async def hold(engine, owner: str):
    """Take the owner's lock on a connection kept open; close it to let go."""
    conn = await engine.connect()
    await conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": lock_key(owner)})
    await conn.commit()
    return conn


async def dead(conn, owners: list[str]) -> list[str]:
    found = []
    for owner in owners:
        k = {"k": lock_key(owner)}
        if (await conn.execute(text("SELECT pg_try_advisory_lock(:k)"), k)).scalar():
            await conn.execute(text("SELECT pg_advisory_unlock(:k)"), k)
            found.append(owner)
    return found
