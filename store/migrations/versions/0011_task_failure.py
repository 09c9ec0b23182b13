"""What kind of failure a task's last error was: `tasks.failure`.

The runner told an outage from a fault by the exception's type when it happened, and what
read the task later (the agent's apology, `steward tasks`, the inspector) by the error's
text. Now the kind is stored with the error: "outage" (the service an effect needs is
down: NotPerformed, Unavailable), "contention" (lost a race to another edit), "fault"
(anything else, or the task's own Fail), "poison" (the process died each time it ran),
"interrupted" (cut off, unsafe to repeat); NULL once a phase succeeds. Existing rows
start with none. A plain ADD COLUMN on both backends.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("failure", sa.String(16)))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        batch.drop_column("failure")
