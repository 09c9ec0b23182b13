"""What every reader yields: an `Item` (one message to import), a `Skip` (a record that is
not a message, such as a Slack join notice) or a `Problem` (a malformed record, skipped and
reported). Plus the small helpers that make outside text safe for both databases."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from store.schema import storable

# Column limits of the store (store/schema.py); PostgreSQL enforces them, SQLite does not.
MAX_KEY = 512
MAX_EXTERNAL_ID = 512
MAX_AUTHOR = 256
MAX_SCOPE = 256


@dataclass(slots=True)
class Item:
    key: str  # the conversation key (joins live conversations: same scheme as connectors)
    kind: str  # "user" or "assistant" (a Steward export's line: any entry kind)
    text: str
    author: str | None
    ref: str | None  # stored on the entry
    external_id: str  # deduplicates it forever on channel "import:<format>"
    created_at: float | None  # when it was said (unix seconds); None: unknown
    owner: str | None = None
    scope: str | None = None  # None: the store's default (private to the owner)
    data: dict[str, Any] | None = None
    # (channel, external id) under which the live connector records this very message:
    # if it took the message in already, the import skips it.
    live_ids: tuple[tuple[str, str], ...] = ()
    # Where the message goes instead when the conversation at `key` belongs to someone
    # else than `owner` (mail: one thread per person, as the email connector does).
    foreign_key: str | None = None
    # A Steward export's line (bot/importers/jsonl.py): where the entry was, the task that
    # wrote it, and the attachments' files for the home's blob store, as (sha256, path).
    seq: int | None = None  # its position in the conversation it was exported from
    task_id: str | None = None
    files: tuple[tuple[str, Any], ...] = ()

    @property
    def head(self) -> bool:
        """A compaction summary is a head marker: the model's context starts there."""
        return self.kind == "compaction"


@dataclass(slots=True)
class Skip:
    reason: str  # e.g. "channel_join", "empty"


@dataclass(slots=True)
class Problem:
    where: str  # "line 17", "general/2020-01-02.json message 3", "message 12 at byte 3456"
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"where": self.where, "reason": self.reason}


def clean(text: str) -> str:
    """Text both databases accept, cleaned before it is compared or cut to length: as the
    store cleans it (`store.schema.storable`), but a NUL in a file is dropped."""
    return storable(text, nul="")


def clean_value(value: Any) -> Any:
    """`clean` applied to every string of a JSON-like value."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(str(k)): clean_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_value(v) for v in value]
    return value


def fit(text: str | None, limit: int) -> str | None:
    return None if text is None else clean(text)[:limit]


def digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "replace"))
        h.update(b"\x00")
    return h.hexdigest()[:32]


def bounded_id(value: str, limit: int = MAX_EXTERNAL_ID) -> str:
    """An id that fits its column: long ones are replaced by a stable hash of themselves."""
    value = clean(value)
    return value if len(value) <= limit else f"sha256:{digest(value)}"
