"""Task queue queries: claiming ready work under a lease, renewing it, recovering after a
crash. Phase commits go through `commit.apply` with a `TaskUpdate`."""

import logging

from sqlalchemy import and_, or_, select, update

from store.errors import CorruptRow
from store.records import BLOCKED, PENDING, RUNNING, Task, now, task_from_row
from store.schema import tasks

log = logging.getLogger(__name__)


def _ready(t: float):
    return or_(and_(tasks.c.state == PENDING, tasks.c.run_after <= t),
               and_(tasks.c.state == RUNNING, tasks.c.lease_expires < t))


async def claim(conn, owner: str, limit: int, lease_seconds: float) -> list[Task]:
    """Lease up to `limit` ready tasks (pending and due, or running with an expired lease)
    to `owner`, oldest first. Each claim counts as an attempt. A row that cannot be decoded
    is blocked with the reason and left out, so it cannot stop the queue."""
    t = now()
    ids = (select(tasks.c.id).where(_ready(t)).order_by(tasks.c.id).limit(limit)
           .with_for_update(skip_locked=True).scalar_subquery())
    rows = (await conn.execute(
        update(tasks).where(tasks.c.id.in_(ids))
        .values(state=RUNNING, lease_owner=owner, lease_expires=t + lease_seconds,
                attempts=tasks.c.attempts + 1, updated_at=t)
        .returning(*tasks.c)
    )).all()
    claimed = []
    for row in rows:
        try:
            claimed.append(task_from_row(row))
        except CorruptRow as exc:
            log.error("blocking task %s: %s", row.id, exc)
            await conn.execute(update(tasks).where(tasks.c.id == row.id).values(
                state=BLOCKED, error=str(exc), lease_owner=None, lease_expires=None,
                updated_at=t))
    claimed.sort(key=lambda task: task.id)
    return claimed


async def renew(conn, owner: str, task_ids: list[str], lease_seconds: float) -> int:
    if not task_ids:
        return 0
    mine = and_(tasks.c.id.in_(task_ids), tasks.c.lease_owner == owner,
                tasks.c.state == RUNNING)
    if conn.dialect.name == "postgresql":
        # Never wait for a row another transaction holds (its task's own commit, or one
        # that locks it on the way to another row): one statement locking several rows in
        # no set order could close a deadlock cycle. A row skipped now is renewed next time.
        mine = tasks.c.id.in_(select(tasks.c.id).where(mine).order_by(tasks.c.id)
                              .with_for_update(skip_locked=True))
    res = await conn.execute(update(tasks).where(mine)
                             .values(lease_expires=now() + lease_seconds))
    return res.rowcount


async def running_owners(conn) -> list[str]:
    return list((await conn.execute(select(tasks.c.lease_owner).distinct().where(
        tasks.c.state == RUNNING, tasks.c.lease_owner.is_not(None)))).scalars())


async def recover(conn, *, steal_all: bool, dead_owners: list[str],
                  registered_kinds: list[str]) -> dict[str, int]:
    """On start: running tasks of dead workers go back to pending (all of them when this
    process knows it is the only worker; else those of workers known dead, and expired
    leases), and tasks blocked for a missing definition are retried if their kind is now
    registered."""
    t = now()
    running = tasks.c.state == RUNNING
    if not steal_all:
        running = and_(running, or_(tasks.c.lease_expires < t,
                                    tasks.c.lease_owner.in_(dead_owners)))
    resumed = (await conn.execute(update(tasks).where(running).values(
        state=PENDING, lease_owner=None, lease_expires=None, run_after=0.0, updated_at=t
    ))).rowcount
    unblocked = 0
    if registered_kinds:
        unblocked = (await conn.execute(
            update(tasks).where(tasks.c.state == BLOCKED, tasks.c.kind.in_(registered_kinds))
            .values(state=PENDING, error=None, updated_at=t))).rowcount
    return {"resumed": resumed, "unblocked": unblocked}


async def next_due(conn) -> float | None:
    """When the earliest pending task becomes due (for the runner's sleep)."""
    return (await conn.execute(
        select(tasks.c.run_after).where(tasks.c.state == PENDING)
        .order_by(tasks.c.run_after).limit(1))).scalar()
