"""Slack conversations created before the scope rule of connectors/slack/routing.py get it.

Channel threads used to be created private to whoever mentioned Steward
(`private:slack:<team>:<user>`), so that person's DM facts reached a thread everyone in the
channel reads. Now a thread in a channel, private channel or group DM shares the channel's
scope, `channel:<channel id>`, as the Slack-export importer has always had it. And a DM
created to refuse someone had no owner, which made it `private:local` (the terminal
user's own scope); it becomes private to that DM alone.

Keys are `slack:<team>:<channel>[:<thread_ts>]`; a DM's channel id starts with "D".

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

conversations = sa.table("conversations", sa.column("id", sa.BigInteger),
                         sa.column("key", sa.String), sa.column("scope", sa.String))


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(sa.select(conversations.c.id, conversations.c.key,
                                  conversations.c.scope)
                        .where(conversations.c.key.like("slack:%"))).all()
    changes = []
    for row in rows:
        parts = row.key.split(":")
        if len(parts) < 3 or not parts[2]:
            continue
        team, channel = parts[1], parts[2]
        if channel.startswith("D"):
            if row.scope == "private:local":
                changes.append({"cid": row.id, "new_scope": f"private:slack-dm:{team}:{channel}"})
        elif row.scope.startswith("private:"):
            changes.append({"cid": row.id, "new_scope": f"channel:{channel}"})
    if changes:
        bind.execute(sa.update(conversations)
                     .where(conversations.c.id == sa.bindparam("cid"))
                     .values(scope=sa.bindparam("new_scope")), changes)


def downgrade() -> None:
    """Nothing to undo: the old scopes were the leak."""
