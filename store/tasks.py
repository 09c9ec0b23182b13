"""Task queue queries: renewing leases, handing tasks back, recovering after a crash.
Claims and lone phase commits are fixed statements (`store/hotpath.py`); every other
phase commit goes through `commit.apply` with a `TaskUpdate`."""

import logging

from sqlalchemy import and_, case, func, or_, select, update

from store.records import BLOCKED, PENDING, RUNNING, now
from store.schema import in_state, tasks

log = logging.getLogger(__name__)


def _died(t: float, where=None) -> dict:
    """A task found running under a lease nobody holds any more: the process holding it
    died (or stalled past its lease). Counted apart from the effect's own failures: a
    death is not the effect's fault, but one that recurs is how a poison input shows."""
    if where is None:
        return {"crashes": tasks.c.crashes + 1,
                "crashed_since": func.coalesce(tasks.c.crashed_since, t)}
    return {"crashes": case((where, tasks.c.crashes + 1), else_=tasks.c.crashes),
            "crashed_since": case((where, func.coalesce(tasks.c.crashed_since, t)),
                                  else_=tasks.c.crashed_since)}


async def release(conn, owner: str, task_ids: list[str], run_after: float,
                  ride: str | None = None) -> int:
    """`ride`: the checkpoint an intent that rode on the claim wrote (store.writes.Claim);
    such a task goes back to its first phase, as nothing of it has run."""
    if not task_ids:
        return 0
    values = dict(state=PENDING, lease_owner=None, lease_expires=None, run_after=run_after,
                  updated_at=now())
    if ride is not None:
        rode = tasks.c.checkpoint == ride
        values.update(phase=case((rode, ""), else_=tasks.c.phase),
                      checkpoint=case((rode, None), else_=tasks.c.checkpoint))
    res = await conn.execute(update(tasks).where(
        tasks.c.id.in_(task_ids), tasks.c.lease_owner == owner, tasks.c.state == RUNNING)
        .values(**values))
    return res.rowcount


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
        in_state(RUNNING), tasks.c.lease_owner.is_not(None)))).scalars())


async def recover(conn, *, steal_all: bool, dead_owners: list[str],
                  registered_kinds: list[str]) -> dict[str, int]:
    """On start: running tasks of dead workers go back to pending, a death counted for each
    (all of them when this process knows it is the only worker; else those of workers
    known dead, and expired leases), and tasks blocked for a missing definition are retried
    if their kind is now registered."""
    t = now()
    running = in_state(RUNNING)
    if not steal_all:
        running = and_(running, or_(tasks.c.lease_expires < t,
                                    tasks.c.lease_owner.in_(dead_owners)))
    resumed = (await conn.execute(update(tasks).where(running).values(
        state=PENDING, lease_owner=None, lease_expires=None, run_after=0.0, updated_at=t,
        **_died(t)))).rowcount
    unblocked = 0
    if registered_kinds:
        unblocked = (await conn.execute(
            update(tasks).where(in_state(BLOCKED), tasks.c.kind.in_(registered_kinds))
            .values(state=PENDING, error=None, updated_at=t))).rowcount
    return {"resumed": resumed, "unblocked": unblocked}


async def next_due(conn) -> float | None:
    """When the earliest pending task becomes due (for the runner's sleep)."""
    return (await conn.execute(
        select(tasks.c.run_after).where(in_state(PENDING))
        .order_by(tasks.c.run_after).limit(1))).scalar()
