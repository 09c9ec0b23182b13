"""Steward's durable store: conversations, entries, tasks, submissions, documents, usage.

Knows nothing of the agent or the connectors. Everything one step writes goes through
`Store.commit(Writes)` in one transaction.
"""

from store.errors import (
    CorruptRow,
    DocumentCorrupt,
    DocumentError,
    LeaseLost,
    NotFound,
    StoreError,
)
from store.records import (
    BLOCKED,
    DONE,
    FAILED,
    INTERRUPTED,
    PENDING,
    RUNNING,
    STATES,
    TERMINAL,
    WAITING,
    CommitResult,
    Conversation,
    DocumentVersion,
    Entry,
    Schedule,
    Task,
    UsageRecord,
    new_id,
)
from store.writes import Claim, ScheduleAdvance, ScheduleWrite, TaskUpdate, Writes

__all__ = [
    "BLOCKED", "DONE", "FAILED", "INTERRUPTED", "PENDING", "RUNNING", "STATES", "TERMINAL",
    "WAITING", "Claim", "CommitResult", "Conversation", "CorruptRow", "DocumentCorrupt",
    "DocumentError", "DocumentVersion", "Entry", "LeaseLost", "NotFound", "Schedule",
    "ScheduleAdvance", "ScheduleWrite", "Store", "StoreError", "Task", "TaskUpdate",
    "UsageRecord", "Writes", "conversation_namespace",
    "new_id", "open_store",
]

from store.search import Hit  # noqa: E402

__all__ += ["Hit"]

_STORE = ("Store", "conversation_namespace", "open_store")


def __getattr__(name: str):
    # The store itself (and with it SQLAlchemy) only when asked for: the reading commands
    # use store.reader, which needs only the records, the SQL and the standard library.
    if name in _STORE:
        from store import store as _store

        return getattr(_store, name)
    raise AttributeError(f"module 'store' has no attribute {name!r}")
