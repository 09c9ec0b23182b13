"""Embeddings of entries, and entries by time.

- `entry_vectors`: one row per (embedding model, entry): the entry's conversation (to
  filter by scope without reading entries) and its vector as little-endian float32 bytes,
  of length one (store/vectors.py). A NULL vector records an entry the provider refused
  to embed, so it is not asked again. Filled in the background by the `embed_entries` task
  (bot/memory/embedding_task.py); entries without a row are what is left to embed.
- `ix_entries_created_at`: "what did Anna say last spring" ranks the entries said in a
  stretch of time (store/search.py), and imported history has ids in import order, not in
  the order it was said.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    blob = "bytea" if bind.dialect.name == "postgresql" else "BLOB"
    bigint = "BIGINT" if bind.dialect.name == "postgresql" else "INTEGER"
    op.execute(f"""CREATE TABLE entry_vectors (
        model VARCHAR(128) NOT NULL,
        entry_id {bigint} NOT NULL REFERENCES entries (id),
        conversation_id {bigint} NOT NULL,
        vec {blob},
        created_at FLOAT NOT NULL,
        PRIMARY KEY (model, entry_id))""")
    op.execute("CREATE INDEX ix_entry_vectors_scope "
               "ON entry_vectors (model, conversation_id, entry_id)")
    op.execute("CREATE INDEX ix_entries_created_at ON entries (created_at)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS ix_entries_created_at")
    op.execute("DROP TABLE IF EXISTS entry_vectors")
