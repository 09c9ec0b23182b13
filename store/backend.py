"""The one seam between `Store` and a database: `Backend`.

`Store` (store/store.py) is the facade every caller uses; it states what the store does
and never asks which database it is on. Each database's way of doing it lives behind this
interface, in store/sqlite/ (one writer thread, reader threads, a file) and
store/postgres/ (pools, a server-side step function, advisory locks). A new database is a
new package implementing it, run through tests/test_store_contract.py.
"""

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from store.engine import Engines
from store.leader import Leader
from store.parents import Parents
from store.records import CommitResult, Task
from store.writes import Claim, Writes


class Backend(Protocol):
    engines: Engines
    dialect: str  # "sqlite" or "postgresql": for the SQL text that differs (search, forget)
    single_node: bool  # one machine only (a file lock then tells a runner it is alone)

    async def opening(self) -> None:
        """Checks before anything is written (SQLite: commits the file lost)."""

    def snapshot_dir(self) -> Path | None:
        """Where a database behind is copied before migrating, when the caller names none."""

    async def commit(self, writes: Writes, then_claim: Claim | None,
                     parents: Parents) -> CommitResult:
        """`writes` in one transaction, then `then_claim`'s tasks in `claimed`.
        Raises `commit.DuplicateSubmission` when the step is not applied."""

    async def claim(self, c: Claim) -> list[Task]: ...

    async def write(self, fn: Callable[[Any], Awaitable]) -> Any:
        """`await fn(conn)` in one write transaction (a SQLAlchemy connection)."""

    async def read(self, fn: Callable[[Any], Awaitable]) -> Any:
        """`await fn(conn)` on a read connection (SQLAlchemy)."""

    async def lookup(self, fn: Callable[[Any], Awaitable]) -> Any:
        """`await fn(conn)` on a `store.read.plain.TextConnection` straight on the driver."""

    def known_statement(self, channel: str, ids: list[str]) -> tuple[Any, dict | None]:
        """The query for which of `ids` a channel has taken in, and its parameters."""

    def leader(self, name: str, poll_seconds: float) -> Leader: ...

    async def dead_owners(self) -> list[str]:
        """Owners of running tasks whose worker died (none where there is one node)."""

    async def announce_worker(self, owner: str) -> bool: ...

    async def close(self) -> None: ...


def backend_for(engines: Engines) -> Backend:
    """The backend for engines made by `store.engine.create_engines`."""
    if engines.dialect == "sqlite":
        from store.sqlite import SqliteBackend

        return SqliteBackend(engines)
    from store.postgres import PostgresBackend

    return PostgresBackend(engines)
