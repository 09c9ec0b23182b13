"""Entry embeddings: stored, found missing, and compared with a question's.

A vector is kept as little-endian float32 bytes scaled to unit length (table
`entry_vectors`, migration 0009), one row per (model, entry), so the cosine similarity of
two vectors is their dot product. Which entries are embedded: those `store/search.py`
searches (`SEARCHABLE_KINDS`, text not empty), as "speaker: text".

Scale, honestly: neither sqlite-vec nor pgvector is usable here (this Python's sqlite3
cannot load extensions; Debian's PostgreSQL 15 has no pgvector package), so there is no
approximate nearest-neighbour index. `nearest` reads the newest `VECTOR_WINDOW` embedded
entries in scope (by the scope index) and takes the dot products in a worker thread: a
conversation or a person's scope is covered whole up to that many entries, a 10^6-entry
store only for its newest stretch (older entries are still found by the lexical ranking).
"""

import asyncio
import json
import math
import struct
import time
from array import array
from dataclasses import dataclass

from store.plain import run

__all__ = ["VECTOR_WINDOW", "Near", "embeddable_text", "missing", "nearest", "pack", "put",
           "unpack"]

VECTOR_WINDOW = 20_000  # embedded entries compared per search, the newest in scope
MAX_CHARS = 4000  # of an entry's text sent to the embedding model
_KINDS = ("user", "assistant", "tool_result", "compaction")  # store.search.SEARCHABLE_KINDS


def pack(vector: list[float]) -> bytes:
    """Unit-length float32 bytes (a zero vector stays zero)."""
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return struct.pack(f"<{len(vector)}f", *(x / norm for x in vector))


def unpack(blob: bytes) -> array:
    a = array("f")
    a.frombytes(blob)
    if not _LITTLE:
        a.byteswap()
    return a


_LITTLE = array("f", [1.0]).tobytes() == struct.pack("<f", 1.0)


def embeddable_text(author: str | None, body: str) -> str:
    """What is embedded for an entry: the speaker's name with the text (people ask "what
    did Anna say about…"), cut to `MAX_CHARS`."""
    body = " ".join(body.split())[:MAX_CHARS]
    return f"{author}: {body}" if author else body


async def missing(conn, model: str, *, after: int, limit: int) -> list[tuple]:
    """(id, conversation_id, author, text) of up to `limit` searchable entries after id
    `after`, oldest first, that have no row for `model` yet."""
    kinds = ", ".join(f"'{k}'" for k in _KINDS)
    rows = await run(conn, (
        f"SELECT e.id, e.conversation_id, e.author, e.text FROM entries AS e "
        f"WHERE e.id > :after AND e.kind IN ({kinds}) AND e.text != '' AND NOT EXISTS "
        f"(SELECT 1 FROM entry_vectors AS v WHERE v.model = :model AND v.entry_id = e.id) "
        f"ORDER BY e.id LIMIT :limit"), {"after": after, "model": model, "limit": limit})
    return [tuple(r) for r in rows]


async def put(conn, dialect: str, model: str, rows: list[tuple[int, int, bytes | None]]) -> None:
    """Store (entry id, conversation id, packed vector or None for refused) rows; a row
    already there stays as it is (a batch repeated after a crash changes nothing)."""
    if not rows:
        return
    from store.schema import entry_vectors
    from store.sql import insert_ignore

    t = time.time()
    await conn.execute(insert_ignore(dialect, entry_vectors, "model", "entry_id"),
                       [{"model": model, "entry_id": e, "conversation_id": c, "vec": v,
                         "created_at": t} for e, c, v in rows])


@dataclass(frozen=True)
class Near:
    id: int
    similarity: float
    kind: str
    author: str | None
    created_at: float


def _dots(query: array, rows: list) -> list[tuple[float, object]]:
    out = []
    for row in rows:
        v = unpack(row.vec)
        if len(v) == len(query):
            out.append((sum(map(float.__mul__, query, v)), row))
    return out


async def nearest(conn, dialect: str, model: str, query: list[float], *,
                  conversation_ids: list[int] | None, k: int,
                  window: int = VECTOR_WINDOW) -> list[Near]:
    """The `k` entries most similar to `query` among the newest `window` embedded entries
    of the given conversations (None: all), best first."""
    if conversation_ids == []:
        return []
    where, params = ["v.model = :model", "v.vec IS NOT NULL"], {"model": model, "w": window}
    if conversation_ids is not None:
        if dialect == "postgresql":
            where.append("v.conversation_id = ANY(CAST(:cids AS bigint[]))")
            params["cids"] = conversation_ids
        else:
            where.append("v.conversation_id IN (SELECT value FROM json_each(:cids))")
            params["cids"] = json.dumps(conversation_ids)
    rows = (await run(conn, (
        f"SELECT v.entry_id AS id, v.vec AS vec, e.kind AS kind, e.author AS author, "
        f"e.created_at AS created_at FROM entry_vectors AS v JOIN entries AS e "
        f"ON e.id = v.entry_id WHERE {' AND '.join(where)} "
        f"ORDER BY v.entry_id DESC LIMIT :w"), params)).all()
    q = unpack(pack(query))
    scored = await asyncio.to_thread(_dots, q, rows)  # ~5 us per vector of 256: off the loop
    scored.sort(key=lambda s: (-s[0], -s[1].id))
    return [Near(r.id, sim, r.kind, r.author, r.created_at) for sim, r in scored[:k]]
