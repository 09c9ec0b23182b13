"""Where a schedule's words came from: `schedules.origin`.

A schedule made or changed by a turn whose request held text from outside (a page, a
forwarded mail: bot/provenance.py) keeps why; its occurrences then reach the model as
outside text, not as the person's own words. NULL: made from the person's own words, as
every existing schedule was taken to be. A plain ADD COLUMN on both backends.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("schedules", sa.Column("origin", sa.Text()))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("origin")
