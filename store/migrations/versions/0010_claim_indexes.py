"""Claims that read only the rows they take, however deep the queue.

A claim used to ask for "pending and due, or running with an expired lease" in id order:
an OR over two indexes and a sort of every ready row, so its cost grew with the queue.
Now each half is its own index range, walked in the order the claim takes rows:
`(state, run_after, id)` for due work (a new task is due from its creation time, so this
is oldest-due first) and `(state, lease_expires)` for leases nobody renews. The first
replaces `(state, run_after)`, which it covers (`next_due` reads it too). Plain CREATE and
DROP INDEX on both backends.

Revision ID: 0010
Revises: 0009
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_tasks_ready", "tasks", ["state", "run_after", "id"])
    op.create_index("ix_tasks_leases", "tasks", ["state", "lease_expires"])
    op.drop_index("ix_tasks_state_run_after", "tasks")


def downgrade() -> None:
    op.create_index("ix_tasks_state_run_after", "tasks", ["state", "run_after"])
    op.drop_index("ix_tasks_leases", "tasks")
    op.drop_index("ix_tasks_ready", "tasks")
