"""`steward_step` as this build generates it from the step's statements.

Until now the function's text was written out by hand in 0015, beside the same statements
in the client; it is generated now (store/postgres/step_function.py), and every migration
that changes a step's statements recreates it with `create_statements()`, after dropping
every function of the name (an early 0015 left dev databases with an older one, which
`CREATE OR REPLACE` kept). `STEP_FUNCTION` is the digest of the text this migration was
written for: tests/test_store_step_function.py fails when the generated text changes and
no newer migration names its digest.

Revision ID: 0018
Revises: 0017
"""

import importlib.util
from pathlib import Path

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

STEP_FUNCTION = "bd8a9da5ff42a941"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    from store.postgres.step_function import create_statements

    for statement in create_statements():
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    from store.postgres.step_function import DROP_ALL

    op.execute(DROP_ALL)
    path = Path(__file__).with_name("0015_pg_step_function.py")
    spec = importlib.util.spec_from_file_location("steward_migration_0015", path)
    earlier = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(earlier)
    earlier.upgrade()
