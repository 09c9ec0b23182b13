"""The store's lookups and the reads behind the transcript commands, as text SQL that
runs straight on a driver (`store.read.plain.TextConnection`: a store reader's SQLite
connection, a hot-path asyncpg one, the CLI's bare `PlainConnection`) or on an SQLAlchemy
connection. A lookup is one statement: the turn makes about twenty, and through
SQLAlchemy each cost two to three times what the driver spends on it; and `steward
sessions`, `log`, `tasks`, `schedules`, `quarantine` and `usage` need no SQLAlchemy at
all."""

from store.errors import NotFound
from store.read.plain import run
from store.records import (
    DONE,
    TERMINAL,
    Conversation,
    Entry,
    Schedule,
    Task,
    conversation_from_row,
    entry_from_row,
    loads,
    schedule_from_row,
    storable,
    task_from_row,
)

CONVERSATION = ('id, "key", owner, parent_id, fork_at, last_seq, meta, created_at, '
                'updated_at, scope, head_seq')
ENTRY = "id, conversation_id, seq, kind, author, text, data, ref, task_id, created_at"


async def conversation(conn, key: str) -> Conversation:
    row = (await run(conn, f'SELECT {CONVERSATION} FROM conversations WHERE "key" = :key',
                     {"key": storable(key)})).first()
    if row is None:
        raise NotFound(f"no conversation {key!r}")
    return conversation_from_row(row)


async def conversation_by_id(conn, conversation_id: int) -> Conversation:
    row = (await run(conn, f"SELECT {CONVERSATION} FROM conversations WHERE id = :id",
                     {"id": conversation_id})).first()
    if row is None:
        raise NotFound(f"no conversation id {conversation_id}")
    return conversation_from_row(row)


async def conversations_page(conn, limit: int, before_id: int | None) -> list[Conversation]:
    params: dict = {"limit": limit}
    where = ""
    if before_id is not None:
        where, params["before"] = "WHERE id < :before ", before_id
    rows = (await run(conn, f"SELECT {CONVERSATION} FROM conversations {where}"
                      "ORDER BY id DESC LIMIT :limit", params)).all()
    return [conversation_from_row(r) for r in rows]


async def lineage(conn, conversation_id: int) -> list[tuple[int, int | None]]:
    """(conversation id, highest visible seq or None) from the fork back to the root."""
    chain = []
    bound = None
    current = conversation_id
    while current is not None:
        row = (await run(conn, "SELECT parent_id, fork_at FROM conversations WHERE id = :id",
                         {"id": current})).first()
        if row is None:
            raise NotFound(f"no conversation id {current}")
        chain.append((current, bound))
        if row.fork_at is not None:
            bound = row.fork_at if bound is None else min(bound, row.fork_at)
        current = row.parent_id
    return chain


def visible_in(chain: list[tuple[int, int | None]], params: dict) -> str:
    """The SQL condition for the entries a conversation's timeline holds (`lineage`: its
    own, and each ancestor's up to its fork point); its parameters go into `params`."""
    visible = []
    for i, (cid, bound) in enumerate(chain):
        params[f"c{i}"] = cid
        if bound is None:
            visible.append(f"conversation_id = :c{i}")
        else:
            params[f"b{i}"] = bound
            visible.append(f"(conversation_id = :c{i} AND seq <= :b{i})")
    return f"({' OR '.join(visible)})"


async def entries_page(conn, conversation_id: int, *, before: int | None,
                       after: int | None, limit: int) -> list[Entry]:
    """One page of a transcript in order (Store.entries_page)."""
    params: dict = {"limit": limit}
    where = visible_in(await lineage(conn, conversation_id), params)
    if after is not None:
        order, params["after"] = "seq > :after ORDER BY seq", after
    elif before is not None:
        order, params["before"] = "seq < :before ORDER BY seq DESC", before
    else:
        order = "1 = 1 ORDER BY seq DESC"
    rows = (await run(conn, f"SELECT {ENTRY} FROM entries WHERE {where} AND {order} "
                      "LIMIT :limit", params)).all()
    page = [entry_from_row(r) for r in rows]
    return page if after is not None else page[::-1]


async def entry_of_task(conn, conversation_id: int, task_id: str) -> Entry | None:
    row = (await run(conn, f"SELECT {ENTRY} FROM entries WHERE task_id = :task AND "
                     "conversation_id = :c ORDER BY seq LIMIT 1",
                     {"task": storable(task_id), "c": conversation_id})).first()
    return None if row is None else entry_from_row(row)


# -- tasks -------------------------------------------------------------------------------

_TERMINAL = ", ".join(f"'{s}'" for s in sorted(TERMINAL))


async def task(conn, task_id: str) -> Task:
    row = (await run(conn, "SELECT * FROM tasks WHERE id = :id",
                     {"id": storable(task_id)})).first()
    if row is None:
        raise NotFound(f"no task {task_id}")
    return task_from_row(row, lenient=True)


async def task_outcome(conn, task_id: str) -> tuple:
    row = (await run(conn, "SELECT state, result, error FROM tasks WHERE id = :id",
                     {"id": storable(task_id)})).first()
    if row is None:
        raise NotFound(f"no task {task_id}")
    return row.state, loads(row.result, table="tasks", row_id=task_id,
                            column="result"), row.error


async def last_result(conn, kind: str, conversation_id: int):
    row = (await run(conn, "SELECT id, result FROM tasks WHERE conversation_id = :c AND "
                     f"kind = :kind AND state = '{DONE}' ORDER BY id DESC LIMIT 1",
                     {"c": conversation_id, "kind": storable(kind)})).first()
    return None if row is None else loads(row.result, table="tasks", row_id=row.id,
                                          column="result")


_TASK_FILTERS = (("state", "state = :state"), ("kind", "kind = :kind"),
                 ("parent_id", "parent_id = :parent_id"),
                 ("conversation_id", "conversation_id = :conversation_id"),
                 ("after_id", "id > :after_id"), ("before_id", "id < :before_id"))


async def tasks_page(conn, *, limit: int, active: bool | None = None,
                     newest_first: bool = False, **where) -> list[Task]:
    """Tasks in id order (`Store.list_tasks`); `where`: the filters given, by name."""
    params = {"limit": limit}
    conditions = []
    for name, condition in _TASK_FILTERS:
        value = where.get(name)
        if value is not None:
            conditions.append(condition)
            params[name] = storable(value) if isinstance(value, str) else value
    if active is not None:
        conditions.append(f"state {'NOT ' if active else ''}IN ({_TERMINAL})")
    sql = (f"SELECT * FROM tasks {'WHERE ' if conditions else ''}{' AND '.join(conditions)} "
           f"ORDER BY id{' DESC' if newest_first else ''} LIMIT :limit")
    return [task_from_row(r, lenient=True) for r in (await run(conn, sql, params)).all()]


def _filtered(table: str, filters: dict, order: str) -> tuple[str, dict]:
    """`SELECT *` of the rows of `table` whose columns equal the filters given (None: no
    filter), in `order`, up to :limit."""
    given = {column: value for column, value in filters.items() if value is not None}
    where = " AND ".join(f"{column} = :{column}" for column in given)
    params = {k: storable(v) if isinstance(v, str) else v for k, v in given.items()}
    return f"SELECT * FROM {table} {'WHERE ' if where else ''}{where} ORDER BY {order} " \
        "LIMIT :limit", params


# -- schedules, quarantine, the ledger ---------------------------------------------------


async def schedules_page(conn, *, state: str | None, conversation_id: int | None,
                         limit: int) -> list[Schedule]:
    """Schedules in id order (`Store.list_schedules`)."""
    sql, params = _filtered("schedules", {"state": state, "conversation_id": conversation_id},
                            "id")
    return [schedule_from_row(r) for r in (await run(conn, sql, {**params,
                                                                  "limit": limit})).all()]


async def submissions_page(conn, *, state: str | None, channel: str | None,
                           limit: int) -> list[dict]:
    """Inbound submissions, newest first (`Store.list_submissions`)."""
    sql, params = _filtered("submissions", {"state": state, "channel": channel}, "id DESC")
    return [r._mapping for r in (await run(conn, sql, {**params, "limit": limit})).all()]


async def spend_report(conn, since: float, day_offset: float, dialect: str) -> list[dict]:
    """The ledger since `since` by person, model and day (`Store.spend_report`)."""
    days = "(u.created_at + :offset) / 86400.0"
    # SQLite's CAST truncates (the same as floor for times after 1970); PostgreSQL's rounds.
    day = f"floor({days})" if dialect == "postgresql" else f"CAST({days} AS INTEGER)"
    rows = (await run(conn, f"""
        SELECT c.owner, u.model, {day} AS day, count(*) AS calls,
               sum(u.input_tokens) AS input_tokens, sum(u.output_tokens) AS output_tokens,
               sum(u.cost_usd) AS cost
        FROM usage u LEFT JOIN conversations c ON c.id = u.conversation_id
        WHERE u.created_at >= :since
        GROUP BY 1, 2, 3
        ORDER BY 3, coalesce(c.owner, ''), 2""",
                      {"since": since, "offset": day_offset})).all()
    return [{"owner": r.owner, "model": r.model, "day": int(r.day), "calls": r.calls,
             "input_tokens": int(r.input_tokens or 0),
             "output_tokens": int(r.output_tokens or 0), "cost": float(r.cost or 0.0)}
            for r in rows]
