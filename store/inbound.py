"""The shared inbound journal: with several workers on one PostgreSQL, an event a channel
acknowledges is in the store before the acknowledgement, so a worker that dies after its
200 loses nothing: another takes the event in.

    put     the event, taken by this worker (`taker`: its home) for `lease` seconds
            (before the ack)
    done    it was taken in: the row goes
    stale   events whose taker's time ran out (it died, or is very slow): taken for
            `lease` more seconds by the caller, oldest first; on PostgreSQL rows another
            worker is taking at this moment are skipped; at a worker's start, also
            what its previous life held

Taking an event in twice is always safe (a message's submission is deduplicated forever),
so a slow worker overtaken by another costs only the repeated work."""

import json

from sqlalchemy import delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from store.records import dumps, now
from store.schema import inbound


async def put(conn, dialect: str, channel: str, event_id: str, body: dict,
              lease: float, taker: str | None) -> None:
    t = now()
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    await conn.execute(insert(inbound).values(
        channel=channel, event_id=event_id, body=dumps(body), taken_until=t + lease,
        taker=taker, created_at=t).on_conflict_do_nothing())


async def done(conn, channel: str, event_ids: list[str]) -> None:
    await conn.execute(delete(inbound).where(inbound.c.channel == channel,
                                             inbound.c.event_id.in_(event_ids)))


async def stale(conn, dialect: str, channel: str, lease: float, limit: int,
                taker: str | None, mine: bool) -> list[dict]:
    """`mine`: also what `taker` itself held (its previous life, at its start)."""
    t = now()
    free = inbound.c.taken_until < t
    if mine and taker is not None:
        free = or_(free, inbound.c.taker == taker)
    due = (select(inbound.c.event_id).where(inbound.c.channel == channel, free)
           .order_by(inbound.c.created_at).limit(limit))
    if dialect == "postgresql":
        due = due.with_for_update(skip_locked=True)
    rows = (await conn.execute(
        update(inbound).where(inbound.c.channel == channel,
                              inbound.c.event_id.in_(due.scalar_subquery()))
        .values(taken_until=t + lease, taker=taker)
        .returning(inbound.c.event_id, inbound.c.body, inbound.c.created_at))).all()
    return [_body(event_id, body) for event_id, body, _ in sorted(rows, key=lambda r: r[2])]


def _body(event_id: str, raw: str) -> dict:
    """The stored event; one that cannot be read comes back as a body the channel will
    refuse and quarantine (with its id, so it leaves the journal), never an exception."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"event_id": event_id, "unreadable": raw}
