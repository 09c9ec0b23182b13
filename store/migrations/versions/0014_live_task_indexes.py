"""The task queue's indexes hold live work only.

`ix_tasks_ready` and `ix_tasks_leases` (0010) carried a row for every task ever run, and
every step rewrote entries in both: a result moved its task's entry into the 'done' part
of each. As partial indexes, the ready one holds pending tasks and the leases one running
tasks, so a claim and a result touch half the index pages (SQLite wrote 3.2 WAL pages a
step instead of 5.1) and the indexes stay the size of the work in flight however long the
store runs. `ix_tasks_blocked` keeps the start's retry of blocked tasks off a table scan.
Queries that should use them name the state as a literal (`store/tasks.py`), as a planner
can match only that to an index's condition.

Revision ID: 0014
Revises: 0013
"""

from alembic import op
from sqlalchemy import text

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_LIVE = (
    ("ix_tasks_ready", ["run_after", "id"], "state = 'pending'"),
    ("ix_tasks_leases", ["lease_expires"], "state = 'running'"),
    ("ix_tasks_blocked", ["kind"], "state = 'blocked'"),
)


def upgrade() -> None:
    op.drop_index("ix_tasks_ready", "tasks")
    op.drop_index("ix_tasks_leases", "tasks")
    for name, columns, where in _LIVE:
        op.create_index(name, "tasks", columns, sqlite_where=text(where),
                        postgresql_where=text(where))


def downgrade() -> None:
    for name, _, _ in _LIVE:
        op.drop_index(name, "tasks")
    op.create_index("ix_tasks_ready", "tasks", ["state", "run_after", "id"])
    op.create_index("ix_tasks_leases", "tasks", ["state", "lease_expires"])
