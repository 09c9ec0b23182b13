"""Memory: who may see a conversation (scope), and where its context starts (the latest
compaction's head marker).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("conversations") as batch:
        # "private:<person>" (a DM, a mail thread, the terminal) or "channel:<id>" (shared)
        batch.add_column(sa.Column("scope", sa.String(256), nullable=False,
                                   server_default="private:local"))
        batch.add_column(sa.Column("head_seq", sa.BigInteger))
    op.create_index("ix_conversations_scope", "conversations", ["scope"])
    # The provider's last reported usage per conversation: the base of token estimates.
    op.create_index("ix_usage_conversation", "usage", ["conversation_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_usage_conversation", "usage")
    op.drop_index("ix_conversations_scope", "conversations")
    with op.batch_alter_table("conversations") as batch:
        batch.drop_column("head_seq")
        batch.drop_column("scope")
