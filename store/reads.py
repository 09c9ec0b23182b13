"""The reads behind the transcript commands, as text SQL that runs on the store's own
connections and on a bare `store.plain.PlainConnection` (the CLI's fast path): one
statement each, so `steward sessions` and `log` need no SQLAlchemy."""

from store.errors import NotFound
from store.plain import run
from store.records import Conversation, Entry, conversation_from_row, entry_from_row, storable

CONVERSATION = ('id, "key", owner, parent_id, fork_at, last_seq, meta, created_at, '
                'updated_at, scope, head_seq')
ENTRY = "id, conversation_id, seq, kind, author, text, data, ref, task_id, created_at"


async def conversation(conn, key: str) -> Conversation:
    row = (await run(conn, f'SELECT {CONVERSATION} FROM conversations WHERE "key" = :key',
                     {"key": storable(key)})).first()
    if row is None:
        raise NotFound(f"no conversation {key!r}")
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


async def entries_page(conn, conversation_id: int, *, before: int | None,
                       after: int | None, limit: int) -> list[Entry]:
    """One page of a transcript in order (Store.entries_page)."""
    chain = await lineage(conn, conversation_id)
    params: dict = {"limit": limit}
    visible = []
    for i, (cid, bound) in enumerate(chain):
        params[f"c{i}"] = cid
        if bound is None:
            visible.append(f"conversation_id = :c{i}")
        else:
            params[f"b{i}"] = bound
            visible.append(f"(conversation_id = :c{i} AND seq <= :b{i})")
    where = f"({' OR '.join(visible)})"
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
