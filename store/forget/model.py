"""What a forget takes (store/forget): the target as data, the plan of what goes, the
record it leaves, and the SQL pieces the selection and the removal share."""

import json
from dataclasses import dataclass, field

from store.read.plain import run

FORGOTTEN = "forgotten"  # a submission's state once it is a tombstone


@dataclass(frozen=True)
class DataMark:
    """Entries whose `data` holds `value` at `path`, in conversations whose key starts with
    `key_prefix` (a Slack member id, known only within its workspace)."""

    key_prefix: str
    path: tuple[str, ...]
    value: str


@dataclass(frozen=True)
class Target:
    """What to forget, as data. `kind` and `name` are what the record says ("person" and
    their id, "session" and its key), `name` only as its SHA-256."""

    kind: str
    name: str
    keys: tuple[str, ...] = ()  # conversations by key
    owners: tuple[str, ...] = ()  # conversations by owner
    scopes: tuple[str, ...] = ()  # conversations by scope
    namespaces: tuple[str, ...] = ()  # documents removed whole, besides the conversations'
    askers: tuple[tuple[str, str, str], ...] = ()  # (task kind, input key, value): theirs
    authors: tuple[str, ...] = ()  # entries by this author, anywhere
    marks: tuple[DataMark, ...] = ()
    notes: tuple[tuple[str, str], ...] = ()  # (message's data key, note's data key)
    schedule_owners: tuple[str, ...] = ()
    scheduled: tuple[str, str] = ()  # (task kind, input key): a turn a schedule that goes started
    submission_keys: tuple[tuple[str, str], ...] = ()  # (channel, LIKE pattern): deleted
    payload_marks: tuple[tuple[str, ...], ...] = ()  # quarantined / journal rows holding all
    withdraw_key: str = "withdraws"  # entry data: positions taken back (the context drops them)
    note: str = "(messages here were removed at the owner's request)"


@dataclass
class Touched:
    """A conversation that stays, with entries removed from what it reads."""

    key: str
    seqs: set[int] = field(default_factory=set)  # removed positions it sees
    moves_head: bool = False  # its head marker (a summary) goes: back to `new_head`
    new_head: int | None = None


@dataclass
class Plan:
    """Everything a target takes, as found now (`counts`: per kind)."""

    conversations: dict[int, str] = field(default_factory=dict)  # removed whole: id -> key
    entries: int = 0  # theirs, and `single`
    single: dict[int, int] = field(default_factory=dict)  # entry id -> its conversation
    summaries: int = 0  # of `single`, compaction summaries
    touched: dict[int, Touched] = field(default_factory=dict)  # stay, entries removed
    searchable: int = 0  # search index rows
    vectors: int = 0
    tasks: set[str] = field(default_factory=set)
    unfinished: int = 0  # of `tasks`, not finished
    documents: list[int] = field(default_factory=list)  # removed whole
    versions: int = 0  # theirs
    scrubbed: list[int] = field(default_factory=list)  # stay, rewritten (parents first)
    copied_from: dict[int, int] = field(default_factory=dict)  # a fork's copy -> its source
    quoted: list[str] = field(default_factory=list)  # texts of their items, cut elsewhere
    quoting_entries: list[int] = field(default_factory=list)  # stay, quote one of them
    quoting_tasks: list[str] = field(default_factory=list)
    tombstones: list[int] = field(default_factory=list)  # submissions kept as ids only
    deleted_submissions: list[int] = field(default_factory=list)
    schedules: list[str] = field(default_factory=list)
    usage: int = 0
    inbound: list[tuple[str, str]] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)  # referred to by nothing that stays
    shared_blobs: int = 0  # referred to by what goes and by what stays: kept

    @property
    def empty(self) -> bool:
        return not (self.conversations or self.single or self.tasks or self.documents
                    or self.scrubbed or self.tombstones or self.deleted_submissions
                    or self.schedules or self.inbound)

    def counts(self) -> dict[str, int]:
        """What goes, per kind (the dry run's listing and the record)."""
        return {"conversations": len(self.conversations), "entries": self.entries,
                "entries_elsewhere": len(self.single) - self.summaries,
                "summaries": self.summaries, "conversations_touched": len(self.touched),
                "search_rows": self.searchable, "vectors": self.vectors,
                "tasks": len(self.tasks), "unfinished_tasks": self.unfinished,
                "documents": len(self.documents), "document_versions": self.versions,
                "documents_scrubbed": len(self.scrubbed),
                "entries_quoting": len(self.quoting_entries),
                "tasks_quoting": len(self.quoting_tasks),
                "submissions": len(self.tombstones) + len(self.deleted_submissions),
                "schedules": len(self.schedules), "usage_rows_detached": self.usage,
                "inbound_events": len(self.inbound), "blobs": len(self.blobs),
                "blobs_shared_kept": self.shared_blobs}


@dataclass(frozen=True)
class Record:
    """A row of `forgotten`: when, what kind, the target's SHA-256, the counts, the blobs
    still to delete, and when the space was reclaimed (None: not yet)."""

    id: int
    kind: str
    target: str
    counts: dict
    blobs: list[str]
    created_at: float
    reclaimed_at: float | None


class Sql:
    """Builds conditions with their parameters, in the dialect's spelling."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.params: dict = {}
        self._n = 0

    def _name(self) -> str:
        self._n += 1
        return f"p{self._n}"

    def isin(self, column: str, values, kind: str = "bigint") -> str:
        values = list(values)
        name = self._name()
        if self.dialect == "postgresql":
            self.params[name] = values
            return f"{column} = ANY(CAST(:{name} AS {kind}[]))"
        self.params[name] = json.dumps(values)
        return f"{column} IN (SELECT value FROM json_each(:{name}))"

    def value(self, v) -> str:
        name = self._name()
        self.params[name] = v
        return f":{name}"

    def like(self, column: str, pattern: str) -> str:
        return f"{column} LIKE {self.value(pattern)} ESCAPE '\\'"


def escaped(text: str) -> str:
    """`text` as it reads inside a LIKE pattern (ESCAPE '\\')."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def searchable(find: str) -> str:
    """Migration 0008's condition for an indexed entry (`find`: instr or strpos)."""
    return ("(kind IN ('user', 'assistant', 'compaction') OR (kind = 'tool_result' AND "
            f"{find}(coalesce(data, ''), '\"name\":\"search_history\"') = 0))")


def decoded(raw):
    try:
        return json.loads(raw) if raw else None
    except (TypeError, ValueError):
        return None


def at_path(data, path: tuple[str, ...]):
    for key in path:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


async def rows_of(conn, sql: str, params: dict | None = None) -> list:
    return (await run(conn, sql, params or {})).all()


async def lock_rows(conn, dialect: str, table: str, values, kind: str = "bigint") -> None:
    """PostgreSQL: these rows locked for the rest of the transaction, in key order (as a
    claim takes them), so no worker adds a row under them meanwhile."""
    if dialect != "postgresql" or not values:
        return
    q = Sql(dialect)
    await run(conn, f"SELECT id FROM {table} WHERE {q.isin('id', sorted(values), kind)} "
                    "ORDER BY id FOR UPDATE", q.params)


def removed_entries(q: Sql, p: Plan) -> str:
    """The entries that go, as a condition on `entries`."""
    return (f"({q.isin('conversation_id', p.conversations)} OR "
            f"{q.isin('id', p.single)})")


