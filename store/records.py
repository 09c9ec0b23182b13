"""Plain records returned by the store, and JSON encoding with per-row error isolation."""

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from store.errors import CorruptRow

# Task states. Terminal ones never change again.
PENDING, RUNNING, WAITING = "pending", "running", "waiting"
DONE, FAILED, INTERRUPTED, BLOCKED = "done", "failed", "interrupted", "blocked"
TERMINAL = frozenset({DONE, FAILED, INTERRUPTED})
STATES = (PENDING, RUNNING, WAITING, DONE, FAILED, INTERRUPTED, BLOCKED)


def now() -> float:
    return time.time()


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # ULID's alphabet: no I, L, O, U
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # ten bits at a time


_last = [0, 0]  # the last id's millisecond and random part
_ids = threading.Lock()


def new_id() -> str:
    """A time-sortable id (a ULID: 48 bits of Unix milliseconds, then 80 random, in 26
    base-32 digits), later than every id made before it in this process: within one
    millisecond the random part counts up, so tasks spawned in order sort in order. Made
    here because the package that made them imported importlib.metadata, 60 ms of every
    command's start."""
    ms = time.time_ns() // 1_000_000
    with _ids:
        last_ms, last_random = _last
        if ms > last_ms:
            random = int.from_bytes(os.urandom(10), "big")
        else:  # the same millisecond, or the clock stepped back: count on from the last
            ms, random = last_ms, last_random + 1
            if random >> 80:
                ms, random = ms + 1, 0
        _last[:] = ms, random
    value = ms << 80 | random
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in range(120, -10, -10)])


def storable(value: str, nul: str = "\ufffd") -> str:
    """Text both backends can store. PostgreSQL text cannot hold a NUL, and no UTF-8 can
    hold a lone surrogate (JSON like "\\ud83d" decodes to one); either would make its step
    fail again on every retry. NUL becomes U+FFFD and a lone surrogate "?", on both
    backends, so they agree. Statements written as `text()` call it on their strings."""
    if "\x00" in value:
        value = value.replace("\x00", nul)
    if value.isascii():  # every bound string passes here: the common case costs no copy
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(raw: str | None, *, table: str, row_id, column: str) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, TypeError) as exc:
        raise CorruptRow(table, row_id, column, str(exc)) from None


@dataclass(frozen=True)
class Conversation:
    id: int
    key: str
    owner: str | None
    parent_id: int | None
    fork_at: int | None
    last_seq: int
    meta: dict
    created_at: float
    updated_at: float
    scope: str = "private:local"
    head_seq: int | None = None


@dataclass(frozen=True)
class Entry:
    id: int
    conversation_id: int
    seq: int
    kind: str
    author: str | None
    text: str
    data: Any
    ref: str | None
    task_id: str | None
    created_at: float


@dataclass(frozen=True)
class Task:
    id: str
    kind: str
    parent_id: str | None
    conversation_id: int | None
    state: str
    phase: str
    inputs: Any
    checkpoint: Any
    result: Any
    error: str | None
    idem_key: str | None
    dedupe_key: str | None
    attempts: int  # failed tries of the current phase
    wait_mode: str | None
    lease_owner: str | None
    lease_expires: float | None
    run_after: float
    created_at: float
    updated_at: float
    crashes: int = 0  # lives that died holding it since its last committed phase
    crashed_since: float | None = None  # when the first of those deaths was found
    # The kind of the last error: "outage", "contention", "fault", "poison", "interrupted"
    # (bot/runtime/definitions.py); None when the last phase succeeded.
    failure: str | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def stalled(self, at: float | None = None,
                alive: Callable[[str], bool | None] | None = None) -> bool:
        """Running, but nobody runs it: its lease was not renewed in time, or `alive(owner)`
        (bot/runtime/owner.py) says the process holding it is gone (killed, or stopped
        with no chance to hand it back). It waits to be resumed, at the next start or by
        another worker: what a person is shown instead of "running"."""
        if self.state != RUNNING:
            return False
        if self.lease_expires is not None and self.lease_expires < (now() if at is None
                                                                    else at):
            return True
        return bool(self.lease_owner) and alive is not None and \
            alive(self.lease_owner) is False


@dataclass(frozen=True)
class Schedule:
    id: str
    conversation_id: int | None
    owner: str | None
    name: str
    prompt: str
    trigger: dict
    timezone: str
    deliver: dict
    catchup: str
    state: str
    next_fire_at: float | None
    last_fire_at: float | None
    fired: int
    created_at: float
    updated_at: float
    origin: str | None = None  # why its words are outside text (bot/provenance.py)


def schedule_from_row(row) -> Schedule:
    m = row._mapping

    def dec(column):
        return loads(m[column], table="schedules", row_id=m["id"], column=column)

    return Schedule(
        id=m["id"], conversation_id=m["conversation_id"], owner=m["owner"], name=m["name"],
        prompt=m["prompt"], trigger=dec("trigger"), timezone=m["timezone"],
        deliver=dec("deliver"), catchup=m["catchup"], state=m["state"],
        next_fire_at=m["next_fire_at"], last_fire_at=m["last_fire_at"], fired=m["fired"],
        created_at=m["created_at"], updated_at=m["updated_at"], origin=m["origin"])


@dataclass(frozen=True)
class UsageRecord:
    provider: str
    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    ok: bool = True
    error: str | None = None
    task_id: str | None = None
    conversation_id: int | None = None


@dataclass(frozen=True)
class DocumentVersion:
    namespace: str
    name: str
    version: int
    value: Any
    conversation_id: int | None
    at_seq: int | None


@dataclass
class CommitResult:
    """What one commit did. `duplicate` means a submission was already known and nothing
    of the step was written."""

    duplicate: bool = False
    entry_seqs: list[int] = field(default_factory=list)
    task_ids: list[str] = field(default_factory=list)
    document_versions: dict[tuple[str, str], int] = field(default_factory=dict)
    claimed: list["Task"] = field(default_factory=list)  # Store.commit(then_claim=)


def conversation_from_row(row) -> Conversation:
    m = row._mapping
    return Conversation(
        id=m["id"], key=m["key"], owner=m["owner"], parent_id=m["parent_id"],
        fork_at=m["fork_at"], last_seq=m["last_seq"],
        meta=loads(m["meta"], table="conversations", row_id=m["id"], column="meta") or {},
        created_at=m["created_at"], updated_at=m["updated_at"], scope=m["scope"],
        head_seq=m["head_seq"],
    )


def entry_from_row(row) -> Entry:
    m = row._mapping
    return Entry(
        id=m["id"], conversation_id=m["conversation_id"], seq=m["seq"], kind=m["kind"],
        author=m["author"], text=m["text"],
        data=loads(m["data"], table="entries", row_id=m["id"], column="data"),
        ref=m["ref"], task_id=m["task_id"], created_at=m["created_at"],
    )


def task_from_row(row, *, lenient: bool = False) -> Task:
    """Decode a task row. Strict (for running it) raises CorruptRow; lenient (for listing
    it) shows an undecodable value as `{"corrupt": reason}` so one bad row cannot hide the
    others."""
    return task_from_mapping(row._mapping, lenient=lenient)


def task_from_mapping(m, *, lenient: bool = False) -> Task:
    """`task_from_row` for a plain mapping of column names (a driver's own row)."""

    def dec(column):
        try:
            return loads(m[column], table="tasks", row_id=m["id"], column=column)
        except CorruptRow as exc:
            if not lenient:
                raise
            return {"corrupt": exc.reason}

    return Task(
        id=m["id"], kind=m["kind"], parent_id=m["parent_id"],
        conversation_id=m["conversation_id"], state=m["state"], phase=m["phase"],
        inputs=dec("inputs"), checkpoint=dec("checkpoint"), result=dec("result"),
        error=m["error"], idem_key=m["idem_key"], dedupe_key=m["dedupe_key"],
        attempts=m["attempts"], wait_mode=m["wait_mode"], lease_owner=m["lease_owner"],
        lease_expires=m["lease_expires"], run_after=m["run_after"],
        created_at=m["created_at"], updated_at=m["updated_at"],
        crashes=m["crashes"], crashed_since=m["crashed_since"], failure=m["failure"],
    )
