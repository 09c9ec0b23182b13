"""The store's lookups on PostgreSQL: text SQL (`store/read/queries.py`) on a hot-path asyncpg
connection, one round trip each.

Through SQLAlchemy's async engine a one-row lookup cost ~0.45 ms of a 0.13 ms round trip:
building and compiling the statement, its cache key, the result machinery. Here a query is
turned into asyncpg's numbered form once (`:name` -> `$n`), prepared once per connection
(asyncpg's statement cache), and autocommitted (`store/engine.py` HotPool).
"""

import re
from functools import lru_cache

from store.read.plain import Result, TextConnection, row_type

_NAMED = re.compile(r"(?<![:\w]):(\w+)")


@lru_cache(maxsize=256)
def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with `:name` parameters as asyncpg's `$1, $2 ...`, and the names in order."""
    names: list[str] = []

    def number(m: re.Match) -> str:
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    return _NAMED.sub(number, sql), tuple(names)


class AsyncpgText(TextConnection):
    dialect = "postgresql"

    def __init__(self, conn):
        self._conn = conn

    async def execute(self, sql: str, params: dict | None = None) -> Result:
        query, names = numbered(sql)
        records = await self._conn.fetch(query, *(params[n] for n in names))
        if not records:
            return Result([])
        row = row_type(tuple(records[0].keys()))
        return Result([row(r.values()) for r in records])
