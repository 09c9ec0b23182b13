"""The reads behind `steward export`, in pages so that a home of any size is walked in
bounded memory: conversations in the order they were made (one person's, or all), a
transcript forward from a position (a fork's with its ancestors' entries up to the fork
point, as `Store.entries_page`), and which documents a namespace holds.

A transcript page here does not fail on a corrupt row: an entry whose `data` is not JSON
comes back with `data` None and its id in the page's `corrupt`, so one bad row cannot
keep the rest of a person's history from being exported."""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from store.errors import CorruptRow
from store.read.plain import run
from store.read.queries import CONVERSATION, ENTRY, lineage, visible_in
from store.records import Conversation, Entry, conversation_from_row, storable
from store.records import loads as _loads


@dataclass
class EntriesPage:
    entries: list[Entry]
    corrupt: list[int] = field(default_factory=list)  # ids whose data could not be read


async def conversations_after(store, after_id: int, *, limit: int,
                              person: str | None = None) -> list[Conversation]:
    """Up to `limit` conversations with an id above `after_id`, oldest first; with
    `person`, only those private to that person (scope `private:<person>`) or owned by
    them."""
    params: dict = {"after": after_id, "limit": limit}
    where = "id > :after"
    if person is not None:
        where += " AND (scope = :scope OR owner = :person)"
        params.update(scope=storable(f"private:{person}"), person=storable(person))
    async with store.reading() as conn:
        rows = (await run(conn, f"SELECT {CONVERSATION} FROM conversations WHERE {where} "
                          "ORDER BY id LIMIT :limit", params)).all()
    return [conversation_from_row(r) for r in rows]


async def transcript(store, conversation_id: int, *, upto: int,
                     limit: int) -> AsyncIterator[EntriesPage]:
    """The entries a conversation shows at positions up to `upto`, in order, `limit` at a
    time, all read on one connection (a conversation of a few entries costs two
    statements and its fork's ancestors one each)."""
    async with store.reading() as conn:
        params: dict = {"limit": limit, "after": 0, "upto": upto}
        where = visible_in(await lineage(conn, conversation_id), params)
        sql = (f"SELECT {ENTRY} FROM entries WHERE {where} "
               "AND seq > :after AND seq <= :upto ORDER BY seq LIMIT :limit")
        while True:
            page = _page((await run(conn, sql, params)).all())
            yield page
            if len(page.entries) < limit:
                return
            params["after"] = page.entries[-1].seq


def _page(rows) -> EntriesPage:
    page = EntriesPage([])
    for row in rows:
        m = row._mapping
        try:
            data = _loads(m["data"], table="entries", row_id=m["id"], column="data")
        except CorruptRow:
            data = None
            page.corrupt.append(m["id"])
        page.entries.append(Entry(
            id=m["id"], conversation_id=m["conversation_id"], seq=m["seq"], kind=m["kind"],
            author=m["author"], text=m["text"], data=data, ref=m["ref"],
            task_id=m["task_id"], created_at=m["created_at"]))
    return page


async def document_names(store, namespace: str) -> list[str]:
    """The names of the documents in `namespace`, sorted."""
    async with store.reading() as conn:
        rows = (await run(conn, "SELECT name FROM documents WHERE namespace = :ns "
                          "ORDER BY name", {"ns": storable(namespace)})).all()
    return sorted(r[0] for r in rows)


async def namespaces_starting(store, prefix: str) -> list[str]:
    """Every document namespace that starts with `prefix` (e.g. "facts:"), sorted."""
    async with store.reading() as conn:
        rows = (await run(conn, "SELECT DISTINCT namespace FROM documents WHERE "
                          "substr(namespace, 1, :n) = :prefix ORDER BY namespace",
                          {"n": len(prefix), "prefix": storable(prefix)})).all()
    return sorted(r[0] for r in rows)
