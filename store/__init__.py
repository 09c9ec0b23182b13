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
from store.outage import is_refused, is_unavailable
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

__all__ = [
    "BLOCKED", "DONE", "FAILED", "INTERRUPTED", "PENDING", "RUNNING", "STATES", "TERMINAL",
    "WAITING", "Claim", "CommitResult", "Conversation", "CorruptRow", "DocumentCorrupt",
    "DocumentError", "DocumentVersion", "Entry", "Hit", "LeaseLost", "NotFound", "Schedule",
    "ScheduleAdvance", "ScheduleWrite", "Store", "StoreError", "Task", "TaskUpdate",
    "NewEntry", "UsageRecord", "Writes", "conversation_namespace",
    "is_refused", "is_unavailable", "new_id", "open_store",
]

# The rest only when asked for: the reading commands use store.read.reader, which needs only
# the records, the SQL and the standard library; `sessions` and `log` neither write nor
# search (the store itself brings SQLAlchemy; the search's patterns take 12 ms to compile).
_LAZY = {"Store": "store.store", "conversation_namespace": "store.store",
         "open_store": "store.store", "Hit": "store.search",
         **{name: "store.writes" for name in ("Claim", "NewEntry", "ScheduleAdvance",
                                               "ScheduleWrite", "TaskUpdate", "Writes")}}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'store' has no attribute {name!r}")
