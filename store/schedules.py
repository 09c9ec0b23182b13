"""Schedule rows: saved whole by the step that creates or changes them, advanced with a
compare-and-set when an occurrence fires, so an occurrence fires once however many
workers or restarts race for it."""

from sqlalchemy import insert, select, update

from store.records import Schedule, dumps, schedule_from_row
from store.schema import schedules
from store.writes import ScheduleAdvance, ScheduleWrite

ACTIVE = "active"


async def apply(conn, dialect: str, change, t: float, already_done: type[Exception]) -> None:
    if isinstance(change, ScheduleAdvance):
        res = await conn.execute(
            update(schedules).where(schedules.c.id == change.id,
                                    schedules.c.next_fire_at == change.expected_next)
            .values(next_fire_at=change.next_fire_at, last_fire_at=change.fired_at,
                    state=change.state, fired=schedules.c.fired + 1, updated_at=t))
        if res.rowcount != 1:
            raise already_done(f"schedule {change.id} occurrence {change.expected_next}")
        return
    assert isinstance(change, ScheduleWrite)
    values = dict(name=change.name, prompt=change.prompt, trigger=dumps(change.trigger),
                  timezone=change.timezone, deliver=dumps(change.deliver),
                  catchup=change.catchup, state=change.state,
                  next_fire_at=change.next_fire_at, conversation_id=change.conversation_id,
                  owner=change.owner, origin=change.origin, updated_at=t)
    res = await conn.execute(update(schedules).where(schedules.c.id == change.id)
                             .values(**values))
    if res.rowcount == 0:
        await conn.execute(insert(schedules).values(id=change.id, fired=0, created_at=t,
                                                    **values))


async def due(conn, t: float, limit: int) -> list[Schedule]:
    query = (select(schedules).where(schedules.c.state == ACTIVE,
                                     schedules.c.next_fire_at <= t)
             .order_by(schedules.c.next_fire_at).limit(limit))
    return [schedule_from_row(r) for r in (await conn.execute(query)).all()]


async def next_time(conn) -> float | None:
    return (await conn.execute(
        select(schedules.c.next_fire_at).where(schedules.c.state == ACTIVE,
                                               schedules.c.next_fire_at.is_not(None))
        .order_by(schedules.c.next_fire_at).limit(1))).scalar()
