"""Search by scope: entries of a conversation in id order, `(conversation_id, id)`.

Full-history search restricted to a scope or one conversation (store/search.py) reads a
conversation's entries newest first and checks each against the query, or collects the
ids of a small scope's entries to filter the full-text index's matches with. The unique
`(conversation_id, seq)` index cannot serve either: seq order is not id order across
commits, and the match is kept in id order. A plain CREATE INDEX on both backends (no
table rebuild, so SQLite's search trigger from 0004 stays in place).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_entries_conversation_id", "entries", ["conversation_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_entries_conversation_id", "entries")
