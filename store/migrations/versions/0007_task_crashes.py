"""Deaths are counted apart from failures: `tasks.crashes` and `tasks.crashed_since`.

A process that dies holding a task used to count as one of the task's attempts, so five
restarts in a row dead-lettered a model call that had done nothing wrong. Now `attempts`
counts only the failures the effect itself reported, and a death is recorded in
`crashes` (reset by every committed phase) with the time of the first one, from which the
runner tells a poison input (it kills every life that runs it) from bad luck. Existing
rows start with no deaths counted. A plain ADD COLUMN on both backends.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("crashes", sa.Integer(), nullable=False,
                                     server_default="0"))
    op.add_column("tasks", sa.Column("crashed_since", sa.Float()))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("crashed_since")
        batch.drop_column("crashes")
