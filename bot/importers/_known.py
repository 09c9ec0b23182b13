"""Which external ids a channel has already seen, many at a time.

STOPGAP: the store has only `submission_state(channel, external_id)` (one id per query).
Until `Store.known_submissions(channel, external_ids) -> set[str]` exists, this runs the
same read-only query through the store's read engine (a private attribute). The store
method is used as soon as it is there; then the fallback below should be deleted.

On PostgreSQL the lookup is one index probe per id (a LATERAL subquery the planner cannot
turn into a scan): a plain `IN (...)` is planned from the table's statistics, and on a
table that was never analyzed (autovacuum off, or a fresh import) it filters every row of
the channel, seconds per batch at 10^5 rows. SQLite always uses the index for `IN`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import bindparam, select, text

from store import Store
from store.schema import submissions

QUERY_IDS = 500  # per query: well under SQLite's bound-parameter limit

_PG_KNOWN = text(
    "SELECT x.id FROM unnest(CAST(:ids AS text[])) AS x(id) CROSS JOIN LATERAL "
    "(SELECT 1 FROM submissions s WHERE s.channel = :channel AND s.external_id = x.id "
    "LIMIT 1) AS hit").bindparams(bindparam("ids"), bindparam("channel"))


async def known_submissions(store: Store, channel: str, external_ids: Sequence[str]) -> set[str]:
    method = getattr(store, "known_submissions", None)
    if method is not None:
        return set(await method(channel, list(external_ids)))
    found: set[str] = set()
    engine = store._engines.read  # STOPGAP: see the module docstring
    async with engine.connect() as conn:
        for i in range(0, len(external_ids), QUERY_IDS):
            part = list(external_ids[i:i + QUERY_IDS])
            if store.dialect == "postgresql":
                rows = await conn.execute(_PG_KNOWN, {"ids": part, "channel": channel})
            else:
                rows = await conn.execute(select(submissions.c.external_id).where(
                    submissions.c.channel == channel, submissions.c.external_id.in_(part)))
            found.update(r[0] for r in rows)
    return found
