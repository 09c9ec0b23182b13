"""Schedules: reminders and recurring jobs; the store is their source of truth.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("conversation_id", BigId, sa.ForeignKey("conversations.id")),
        sa.Column("owner", sa.String(256)),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("trigger", sa.Text, nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("deliver", sa.Text, nullable=False),
        sa.Column("catchup", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("next_fire_at", sa.Float),
        sa.Column("last_fire_at", sa.Float),
        sa.Column("fired", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("ix_schedules_state_next", "schedules", ["state", "next_fire_at"])


def downgrade() -> None:
    op.drop_table("schedules")
