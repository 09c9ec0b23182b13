"""Reads for the inspector's health view (`steward web`): what went wrong lately, as text
SQL on a reading connection (`Store.reading()` or a `Reader`'s), like store/read/queries.py.

Tasks have no index on `updated_at` (the claim's indexes hold live work only), so the
errors of a day are found among the tasks made in the last `lookback` seconds: task ids
are ULIDs, time-sortable, so that is a primary-key range, however long the history. A
task older than that which failed today is missed: its conversation still shows it."""

from store.read.plain import run
from store.records import Task, storable, task_from_row

_B32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford's base 32, as store.records.new_id


def id_floor(t: float) -> str:
    """The smallest task id made at or after unix time `t` (a ULID's first 10 digits are
    its milliseconds)."""
    ms = max(0, int(t * 1000))
    digits = []
    for _ in range(10):
        digits.append(_B32[ms & 31])
        ms >>= 5
    return "".join(reversed(digits)) + "0" * 16


async def recent_errors(conn, since: float, *, lookback: float, limit: int) -> list[Task]:
    """Tasks that failed, or last failed a try, at or after `since`, newest first (those
    made within `lookback` seconds before `since`)."""
    rows = (await run(conn, "SELECT * FROM tasks WHERE id >= :floor AND updated_at >= :since "
                      "AND (error IS NOT NULL OR state IN ('failed', 'blocked', "
                      "'interrupted')) ORDER BY updated_at DESC LIMIT :limit",
                      {"floor": storable(id_floor(since - lookback)), "since": since,
                       "limit": limit})).all()
    return [task_from_row(r, lenient=True) for r in rows]


async def quarantined_since(conn, since: float) -> int:
    """How many inbound items were quarantined at or after `since`."""
    return (await run(conn, "SELECT count(*) AS n FROM submissions WHERE state = "
                      "'quarantined' AND created_at >= :since", {"since": since})).first().n
