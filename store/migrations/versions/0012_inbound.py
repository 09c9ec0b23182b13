"""The shared inbound journal: `inbound`, events a channel acknowledged and has not yet
taken in, readable by every worker on the store (store/inbound.py). A new table; nothing
existing changes.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "inbound",
        sa.Column("channel", sa.String(64), primary_key=True),
        sa.Column("event_id", sa.String(512), primary_key=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("taken_until", sa.Float, nullable=False),
        sa.Column("taker", sa.String(512)),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_inbound_taken", "inbound", ["channel", "taken_until"])


def downgrade() -> None:
    op.drop_index("ix_inbound_taken", "inbound")
    op.drop_table("inbound")
