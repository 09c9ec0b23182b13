"""The parent of each task a store claimed: a result that wakes no parent can then be one
statement (PostgreSQL), or one that need not read the parent back (SQLite). Parents never
change, so what is remembered stays true; it is forgotten when the lease is given up."""

from store.records import Task

_KEPT = 100_000  # leases lost long ago past this: start afresh

UNKNOWN = "?"


class Parents:
    def __init__(self) -> None:
        self._known: dict[str, str | None] = {}

    def get(self, task_id: str | None) -> str | None:
        """The task's parent, None if it has none, `UNKNOWN` if not claimed here."""
        return UNKNOWN if task_id is None else self._known.get(task_id, UNKNOWN)

    def remember(self, claimed: list[Task]) -> None:
        if len(self._known) > _KEPT:
            self._known.clear()
        self._known.update((t.id, t.parent_id) for t in claimed)

    def forget(self, task_id: str) -> None:
        self._known.pop(task_id, None)
