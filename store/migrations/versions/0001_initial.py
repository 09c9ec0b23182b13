"""Initial schema: conversations, entries, tasks, submissions, documents, usage.

Frozen on purpose: later schema changes get their own revision, so a database written by
this version still upgrades the same way.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(512), nullable=False, unique=True),
        sa.Column("owner", sa.String(256)),
        sa.Column("parent_id", BigId, sa.ForeignKey("conversations.id")),
        sa.Column("fork_at", sa.BigInteger),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.Column("meta", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "entries",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("conversation_id", BigId, sa.ForeignKey("conversations.id"), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("author", sa.String(256)),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("data", sa.Text),
        sa.Column("ref", sa.String(512)),
        sa.Column("task_id", sa.String(32)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("conversation_id", "seq", name="uq_entries_conversation_seq"),
    )
    op.create_table(
        "tasks",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("parent_id", sa.String(32), sa.ForeignKey("tasks.id")),
        sa.Column("conversation_id", BigId, sa.ForeignKey("conversations.id")),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("phase", sa.String(64), nullable=False),
        sa.Column("inputs", sa.Text, nullable=False),
        sa.Column("checkpoint", sa.Text),
        sa.Column("result", sa.Text),
        sa.Column("error", sa.Text),
        sa.Column("idem_key", sa.String(128)),
        sa.Column("dedupe_key", sa.String(512), unique=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("wait_mode", sa.String(16)),
        sa.Column("lease_owner", sa.String(128)),
        sa.Column("lease_expires", sa.Float),
        sa.Column("run_after", sa.Float, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_tasks_state_run_after", "tasks", ["state", "run_after"])
    op.create_index("ix_tasks_parent", "tasks", ["parent_id"])
    op.create_index("ix_tasks_conversation_kind", "tasks", ["conversation_id", "kind", "id"])
    op.create_index("ix_entries_task", "entries", ["task_id"])
    op.create_table(
        "submissions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("external_id", sa.String(512), nullable=False),
        sa.Column("conversation_id", BigId, sa.ForeignKey("conversations.id")),
        sa.Column("task_id", sa.String(32)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("payload", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("channel", "external_id", name="uq_submissions_channel_external"),
    )
    op.create_table(
        "documents",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(512), nullable=False),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("history", sa.String(16), nullable=False),
        sa.Column("fork_policy", sa.String(16), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("forked_from", BigId, sa.ForeignKey("documents.id")),
        sa.Column("fork_at", sa.BigInteger),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.UniqueConstraint("namespace", "name", name="uq_documents_namespace_name"),
    )
    op.create_table(
        "document_versions",
        sa.Column("document_id", BigId, sa.ForeignKey("documents.id"), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("base", sa.Text),
        sa.Column("ops", sa.Text),
        sa.Column("conversation_id", BigId),
        sa.Column("at_seq", sa.BigInteger),
        sa.Column("task_id", sa.String(32)),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "usage",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(32)),
        sa.Column("conversation_id", BigId),
        sa.Column("provider", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("input_tokens", sa.Integer, nullable=False),
        sa.Column("output_tokens", sa.Integer, nullable=False),
        sa.Column("cache_read_tokens", sa.Integer, nullable=False),
        sa.Column("cache_write_tokens", sa.Integer, nullable=False),
        sa.Column("cost_usd", sa.Float, nullable=False),
        sa.Column("ok", sa.Boolean, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_usage_created", "usage", ["created_at"])


def downgrade() -> None:
    for name in ("usage", "document_versions", "documents", "submissions", "tasks",
                 "entries", "conversations"):
        op.drop_table(name)
