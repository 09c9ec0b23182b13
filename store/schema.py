"""Table definitions used by queries (the migrations under `migrations/` create them).

Every JSON value is stored as TEXT and decoded row by row, so one corrupt row can be
reported and isolated instead of breaking a whole query. Timestamps are unix seconds.
"""

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    literal_column,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, REAL

from store.records import storable  # noqa: F401 (where the store's callers long found it)

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL wants 64 bits for years of rows.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class _NoNul:
    def process_bind_param(self, value, dialect):
        return storable(value) if isinstance(value, str) else value


class SafeText(_NoNul, TypeDecorator):
    impl = Text
    cache_ok = True


class SafeString(_NoNul, TypeDecorator):
    impl = String
    cache_ok = True


metadata = MetaData()


def _where(condition: str) -> dict:
    """A partial index's condition, on both backends."""
    return {"sqlite_where": text(condition), "postgresql_where": text(condition)}


def in_state(state: str):
    """`tasks.state = '<state>'` with the state written into the statement: a planner can
    use a partial index (`ix_tasks_ready` ...) only for a condition it reads as that
    index's own, which a bound parameter is not."""
    if not state.isidentifier():  # the states are constants (store.records); keep it so
        raise ValueError(f"not a task state: {state!r}")
    return tasks.c.state == literal_column(f"'{state}'")

conversations = Table(
    "conversations",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("key", SafeString(512), nullable=False, unique=True),
    Column("owner", SafeString(256)),
    Column("parent_id", BigId, ForeignKey("conversations.id")),
    Column("fork_at", BigInteger),
    Column("last_seq", BigInteger, nullable=False, default=0),
    Column("meta", SafeText, nullable=False, default="{}"),
    # Who may see it: "private:<person>" or "channel:<id>" (memory never crosses scopes).
    Column("scope", SafeString(256), nullable=False, default="private:local"),
    # Where the model's context starts: the latest compaction's head marker, if any.
    Column("head_seq", BigInteger),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Index("ix_conversations_scope", "scope"),
)

# Full-text search (store/search.py) reads an index that is not part of this metadata: the
# migrations build it (0004, rebuilt by 0008) and the search reaches it through `text()`
# only. SQLite: the FTS5 tables `entries_fts` (speaker name and text, Porter stems) and
# `entries_cjk` (trigrams, with `entries_cjk_vocab`), fed by the trigger `entries_search_ai`.
# PostgreSQL: the column `entries.search_vec`, filled by the trigger `entries_search_bi`,
# with the GIN index `ix_entries_search`. Declared here, `select(entries)` would read the
# column everywhere. tests/test_search_migration.py checks that the rest matches.
SEARCH_INDEX = {"sqlite": ("entries_fts", "entries_cjk"),
                "postgresql": ("search_vec", "ix_entries_search")}

entries = Table(
    "entries",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("conversation_id", BigId, ForeignKey("conversations.id"), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("kind", SafeString(32), nullable=False),
    Column("author", SafeString(256)),
    Column("text", SafeText, nullable=False, default=""),
    Column("data", SafeText),
    Column("ref", SafeString(512)),
    Column("task_id", SafeString(32)),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("conversation_id", "seq", name="uq_entries_conversation_seq"),
    Index("ix_entries_task", "task_id"),
    Index("ix_entries_conversation_id", "conversation_id", "id"),  # search by scope (0005)
    Index("ix_entries_created_at", "created_at"),  # search by the question's time (0009)
)

# Embeddings (0009, store/vectors.py): float32 bytes of unit length; NULL = refused.
# `embedding` (0013): on PostgreSQL with pgvector, the same vector as `real[]`, searched by
# a partial HNSW index per model on `embedding::vector(D)`; NULL elsewhere (SQLite's index
# is a file, store/vector_index.py).
entry_vectors = Table(
    "entry_vectors",
    metadata,
    Column("model", SafeString(128), primary_key=True),
    Column("entry_id", BigId, ForeignKey("entries.id"), primary_key=True),
    Column("conversation_id", BigId, nullable=False),
    Column("vec", LargeBinary),
    Column("created_at", Float, nullable=False),
    Column("embedding", LargeBinary().with_variant(ARRAY(REAL()), "postgresql")),
    Index("ix_entry_vectors_scope", "model", "conversation_id", "entry_id"),
)

tasks = Table(
    "tasks",
    metadata,
    Column("id", SafeString(32), primary_key=True),
    Column("kind", SafeString(128), nullable=False),
    Column("parent_id", SafeString(32), ForeignKey("tasks.id")),
    Column("conversation_id", BigId, ForeignKey("conversations.id")),
    Column("state", SafeString(16), nullable=False),
    Column("phase", SafeString(64), nullable=False, default=""),
    Column("inputs", SafeText, nullable=False),
    Column("checkpoint", SafeText),
    Column("result", SafeText),
    Column("error", SafeText),
    Column("failure", SafeString(16)),  # the last error's kind (migration 0011)
    Column("idem_key", SafeString(128)),
    Column("dedupe_key", SafeString(512), unique=True),
    Column("attempts", Integer, nullable=False, default=0),
    # Lives of the process that died holding the task since its last committed phase, and
    # when the first of those deaths was found (poison detection, bot/runtime/runner.py).
    Column("crashes", Integer, nullable=False, default=0, server_default="0"),
    Column("crashed_since", Float),
    Column("wait_mode", SafeString(16)),
    Column("lease_owner", SafeString(128)),
    Column("lease_expires", Float),
    Column("run_after", Float, nullable=False, default=0.0),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # A claim walks these in the order it takes rows (0010): due work oldest-due first,
    # and leases nobody renews. Live work only (0014): finished tasks are in neither.
    Index("ix_tasks_ready", "run_after", "id", **_where("state = 'pending'")),
    Index("ix_tasks_leases", "lease_expires", **_where("state = 'running'")),
    Index("ix_tasks_blocked", "kind", **_where("state = 'blocked'")),
    Index("ix_tasks_parent", "parent_id"),
    Index("ix_tasks_conversation_kind", "conversation_id", "kind", "id"),
)

submissions = Table(
    "submissions",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("channel", SafeString(64), nullable=False),
    Column("external_id", SafeString(512), nullable=False),
    Column("conversation_id", BigId, ForeignKey("conversations.id")),
    Column("task_id", SafeString(32)),
    Column("state", SafeString(16), nullable=False),
    Column("reason", SafeText),
    Column("payload", SafeText),
    Column("created_at", Float, nullable=False),
    UniqueConstraint("channel", "external_id", name="uq_submissions_channel_external"),
)

# Events a channel acknowledged and has not finished taking in, where every worker sees
# them (several workers on one PostgreSQL; store/inbound.py). One row per event.
inbound = Table(
    "inbound",
    metadata,
    Column("channel", SafeString(64), primary_key=True),
    Column("event_id", SafeString(512), primary_key=True),
    Column("body", SafeText, nullable=False),
    Column("taken_until", Float, nullable=False),  # a worker is on it until then
    Column("taker", SafeString(512)),  # which worker (its home): its next start takes it back
    Column("created_at", Float, nullable=False),
    Index("ix_inbound_taken", "channel", "taken_until"),
)

documents = Table(
    "documents",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("namespace", SafeString(512), nullable=False),
    Column("name", SafeString(256), nullable=False),
    Column("history", SafeString(16), nullable=False),
    Column("fork_policy", SafeString(16), nullable=False),
    Column("version", Integer, nullable=False, default=0),
    # A fork's copy: positions before fork_at are read from the document it came from.
    Column("forked_from", BigId, ForeignKey("documents.id")),
    Column("fork_at", BigInteger),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint("namespace", "name", name="uq_documents_namespace_name"),
)

document_versions = Table(
    "document_versions",
    metadata,
    Column("document_id", BigId, ForeignKey("documents.id"), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("base", SafeText),
    Column("ops", SafeText),
    Column("conversation_id", BigId),
    Column("at_seq", BigInteger),
    Column("task_id", SafeString(32)),
    Column("created_at", Float, nullable=False),
)

usage = Table(
    "usage",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("task_id", SafeString(32)),
    Column("conversation_id", BigId),
    Column("provider", SafeString(64), nullable=False),
    Column("model", SafeString(256), nullable=False),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("cache_read_tokens", Integer, nullable=False, default=0),
    Column("cache_write_tokens", Integer, nullable=False, default=0),
    Column("cost_usd", Float, nullable=False, default=0.0),
    Column("ok", Boolean, nullable=False),
    Column("error", SafeText),
    Column("created_at", Float, nullable=False),
    Index("ix_usage_created", "created_at"),
    Index("ix_usage_conversation", "conversation_id", "id"),
)

schedules = Table(
    "schedules",
    metadata,
    Column("id", SafeString(32), primary_key=True),
    Column("conversation_id", BigId, ForeignKey("conversations.id")),
    Column("owner", SafeString(256)),
    Column("name", SafeString(256), nullable=False),
    Column("prompt", SafeText, nullable=False),
    Column("trigger", SafeText, nullable=False),  # JSON: {"kind": "date"|"interval"|"cron", ...}
    Column("timezone", SafeString(64), nullable=False),
    Column("deliver", SafeText, nullable=False),  # JSON: {"channel": ..., "reply_to": {...}}
    Column("catchup", SafeString(16), nullable=False),  # "latest" | "all" | "skip"
    Column("state", SafeString(16), nullable=False),  # "active" | "paused" | "done" | "cancelled"
    Column("next_fire_at", Float),
    Column("last_fire_at", Float),
    Column("fired", Integer, nullable=False, default=0),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Column("origin", SafeText),  # why its words are outside text (migration 0016); NULL: own
    Index("ix_schedules_state_next", "state", "next_fire_at"),
)

# One row per `steward forget` (migration 0017, store/forget.py): what kind of thing went,
# the SHA-256 of its name, how many of each kind, the blobs still to delete; no content.
forgotten = Table(
    "forgotten",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("kind", SafeString(16), nullable=False),
    Column("target", SafeString(64), nullable=False),
    Column("counts", SafeText, nullable=False),
    Column("blobs", SafeText),
    Column("created_at", Float, nullable=False),
    Column("reclaimed_at", Float),
)
