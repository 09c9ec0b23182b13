"""What `steward forget` did, without what it took: the table `forgotten`.

One row per forget (store/forget.py), written in the transaction that removes what it
names, so the record and the removal land together or not at all:

- `kind`: "person" or "session";
- `target`: the SHA-256 (hex) of the person's id or the conversation's key: whoever knows
  the name can check that it was forgotten; the table lists no one;
- `counts`: JSON, how many of each kind went (conversations, entries, tasks, ...);
- `blobs`: JSON, the attachment blobs still to delete from the home (NULL once they are:
  a process stopped in between leaves them for the next forget to finish);
- `created_at`, `reclaimed_at` (NULL until the space was reclaimed: store/reclaim.py).

A plain CREATE TABLE on both backends.

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "forgotten",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("target", sa.String(64), nullable=False),
        sa.Column("counts", sa.Text, nullable=False),
        sa.Column("blobs", sa.Text),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("reclaimed_at", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("forgotten")
