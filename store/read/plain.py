"""Reading an SQLite store through the standard library alone.

`steward sessions`, `log` and `search` are over before SQLAlchemy would have finished
importing (~0.25 s of a 0.3 s budget). They run the same text SQL as the store
(`store/read/queries.py`, `store/search.py`, `store/vectors.py`), through `run`, which takes an
SQLAlchemy connection or this one. Named parameters (`:name`) are SQLite's own syntax.
"""

import asyncio
import sqlite3
from typing import Any


class Row(tuple):
    """A result row: by position, by attribute, and as `_mapping` (as SQLAlchemy's)."""

    __slots__ = ()
    _names: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        try:
            return self[self._names[name]]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def _mapping(self) -> dict[str, Any]:
        return {name: self[i] for name, i in self._names.items()}


class Result:
    def __init__(self, rows: list[Row]):
        self._rows = rows

    def __iter__(self):
        return iter(self._rows)

    def all(self) -> list[Row]:
        return self._rows

    def first(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def one(self) -> Row:
        if len(self._rows) != 1:
            raise LookupError(f"expected one row, got {len(self._rows)}")
        return self._rows[0]

    def scalar(self) -> Any:
        return self._rows[0][0] if self._rows else None


def row_type(names: tuple[str, ...]) -> type[Row]:
    """The `Row` class for a result's column names (made once per shape of result)."""
    made = _ROW_TYPES.get(names)
    if made is None:
        if len(_ROW_TYPES) >= 512:  # queries are a fixed set: this is only a safety net
            _ROW_TYPES.clear()
        made = _ROW_TYPES[names] = type("Row", (Row,), {
            "__slots__": (), "_names": {n: i for i, n in enumerate(names)}})
    return made


_ROW_TYPES: dict[tuple[str, ...], type[Row]] = {}


class TextConnection:
    """Text SQL with `:name` parameters straight on a driver (what `run` takes besides an
    SQLAlchemy connection): `await conn.execute(sql, params)` gives a `Result` of `Row`s."""

    dialect = "sqlite"

    async def execute(self, sql: str, params: dict | None = None) -> Result:
        raise NotImplementedError


def fetch(db: sqlite3.Connection, sql: str, params: dict | None) -> list[Row]:
    cur = db.execute(sql, params or {})
    if cur.description is None:
        return []
    row = row_type(tuple(d[0] for d in cur.description))
    return [row(r) for r in cur.fetchall()]


class InlineSqlite(TextConnection):
    """Over a connection this thread owns (a store reader's): each statement is done by
    the time it is awaited, so a read runs whole through `store.writer.run_inline`."""

    def __init__(self, db: sqlite3.Connection):
        self._db = db

    async def execute(self, sql: str, params: dict | None = None) -> Result:
        return Result(fetch(self._db, sql, params))


class PlainConnection(TextConnection):
    """A read-only connection to an SQLite file; each query runs in a thread."""

    def __init__(self, path: str):
        self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self._lock = asyncio.Lock()  # one statement at a time on the one connection

    async def execute(self, sql: str, params: dict | None = None) -> Result:
        async with self._lock:
            return Result(await asyncio.to_thread(fetch, self._db, sql, params))

    async def close(self) -> None:
        await asyncio.to_thread(self._db.close)


async def run(conn, sql: str, params: dict | None = None):
    """`sql` with named parameters on `conn`: an SQLAlchemy async connection or a
    `TextConnection`."""
    if isinstance(conn, TextConnection):
        return await conn.execute(sql, params)
    from sqlalchemy import text

    return await conn.execute(text(sql), params or {})
