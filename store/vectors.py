"""Entry embeddings: stored, found missing, and compared with a question's.

A vector is kept as little-endian float32 bytes scaled to unit length (table
`entry_vectors`, migration 0009), one row per (model, entry), so the cosine similarity of
two vectors is their dot product. Which entries are embedded: those `store/search.py`
searches (`SEARCHABLE_KINDS`, text not empty), as "speaker: text".

`nearest` never returns an entry outside the conversations it is given: every candidate,
however found, comes out of SQL that filters by `conversation_id`, with its similarity
computed from the stored vector. How it finds them:

- a scope of at most `VECTOR_WINDOW` embedded entries (a conversation, most people's
  scopes): exact, every vector of the scope compared (numpy, streamed in chunks, so memory
  stays flat; on PostgreSQL with pgvector, an exact `ORDER BY` in the server);
- a larger scope (the whole store, a person's many conversations): an approximate index,
  whose hits are re-checked against the scope in SQL and re-scored exactly:
  - PostgreSQL with pgvector (migration 0013, scripts/install-pgvector): a partial HNSW
    index per model on `embedding::vector(D)`, searched with the conversation filter and
    pgvector's iterative scan (`hnsw.iterative_scan = relaxed_order`), so a scope keeps
    its k hits however little of the store it is; short of k, the exact search;
  - SQLite: a usearch HNSW file beside the database (store/vector_index.py), rebuilt
    from `entry_vectors` and caught up from it, so it is never the source of truth;
  - neither (PostgreSQL without pgvector, an SQLite database in memory, an unwritable
    directory): exact over the newest `window` embedded entries of the scope, as before.
"""

import asyncio
import hashlib
import json
import math
import struct
import time
from array import array
from dataclasses import dataclass

from store.read.plain import run
from store.search import SEARCHABLE_KINDS as _KINDS  # what the index holds

__all__ = ["VECTOR_WINDOW", "Near", "embeddable_text", "ensure_pg_index", "explain", "index_sql",
           "missing", "nearest", "pack", "put", "unpack"]

VECTOR_WINDOW = 20_000  # a scope up to this many embedded entries is searched exactly
MAX_CHARS = 4000  # of an entry's text sent to the embedding model
CHUNK = 4096  # rows of vectors read and compared at a time by the exact search


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


# -- pgvector (PostgreSQL) -----------------------------------------------------------------


def _quoted(model: str) -> str:
    """`model` as an SQL string literal, safe inside SQLAlchemy's `text()` (a colon would
    read as a parameter). Inlined, not bound: a partial index is only used by a plan that
    sees the constant."""
    return "'" + model.replace("'", "''").replace(":", "\\:") + "'"


def _index_name(model: str, dim: int) -> str:
    return f"ix_entry_vectors_hnsw_{hashlib.sha1(model.encode()).hexdigest()[:16]}_{dim}"


def index_sql(schema: str, model: str, dim: int) -> str:
    """The partial HNSW index of one model's vectors (inner product on unit vectors)."""
    return (f'CREATE INDEX IF NOT EXISTS {_index_name(model, dim)} ON entry_vectors '
            f'USING hnsw ((CAST(embedding AS "{schema}".vector({dim}))) '
            f'"{schema}".vector_ip_ops) WHERE model = {_quoted(model)}')


@dataclass(frozen=True)
class _Pg:
    schema: str | None  # the vector extension's, None: not installed in this database
    dim: int | None  # the dimension of this model's HNSW index, None: no index yet


async def _pg(conn, model: str) -> _Pg:
    h = hashlib.sha1(model.encode()).hexdigest()[:16]
    row = (await run(conn, (
        "SELECT (SELECT n.nspname FROM pg_extension AS x JOIN pg_namespace AS n "
        "ON n.oid = x.extnamespace WHERE x.extname = 'vector') AS schema, "
        "(SELECT max(c.relname) FROM pg_class AS c WHERE c.relkind = 'i' "
        "AND c.relnamespace = to_regnamespace(current_schema()) AND c.relname LIKE :name) AS ix"),
        {"name": f"ix\\_entry\\_vectors\\_hnsw\\_{h}\\_%"})).one()
    dim = int(row.ix.rsplit("_", 1)[1]) if row.ix else None
    return _Pg(row.schema, dim)


async def ensure_pg_index(conn, model: str, dim: int) -> _Pg:
    """The model's HNSW index, made if pgvector is there and the index is not, and the
    model has no vectors yet (called before its first are stored, so the index is cheap
    to make and covers them all). A model that has vectors without an index (stored
    while pgvector was missing) keeps the exact search: an index over some of them only
    would hide the others."""
    pg = await _pg(conn, model)
    if pg.schema is not None and pg.dim is None and (await run(conn, (
            "SELECT NOT EXISTS (SELECT 1 FROM entry_vectors WHERE model = :m)"),
            {"m": model})).scalar():
        await run(conn, index_sql(pg.schema, model, dim))
        pg = _Pg(pg.schema, dim)
    return pg


def _literal(blob: bytes) -> str:
    return "{" + ",".join(repr(x) for x in struct.unpack(f"<{len(blob) // 4}f", blob)) + "}"


async def put(conn, dialect: str, model: str, rows: list[tuple[int, int, bytes | None]]) -> None:
    """Store (entry id, conversation id, packed vector or None for refused) rows; a row
    already there stays as it is (a batch repeated after a crash changes nothing). On
    PostgreSQL with pgvector the vector is also written to `embedding` (the same
    statement), unless its length is not the one of the model's index."""
    if not rows:
        return
    t = time.time()
    if dialect == "postgresql":
        dims = [len(v) // 4 for _, _, v in rows if v]
        pg = await ensure_pg_index(conn, model, dims[0]) if dims else await _pg(conn, model)
        if pg.dim is not None:
            await run(conn, (
                "INSERT INTO entry_vectors (model, entry_id, conversation_id, vec, created_at, "
                "embedding) SELECT :model, u.e, u.c, u.v, :t, CAST(u.x AS real[]) "
                "FROM unnest(CAST(:es AS bigint[]), CAST(:cs AS bigint[]), "
                "CAST(:vs AS bytea[]), CAST(:xs AS text[])) AS u(e, c, v, x) "
                "ON CONFLICT (model, entry_id) DO NOTHING"),
                {"model": model, "t": t, "es": [e for e, _, _ in rows],
                 "cs": [c for _, c, _ in rows], "vs": [v for _, _, v in rows],
                 "xs": [_literal(v) if v and len(v) // 4 == pg.dim else None
                        for _, _, v in rows]})
            return
    from store.schema import entry_vectors
    from store.sql import insert_ignore

    await conn.execute(insert_ignore(dialect, entry_vectors, "model", "entry_id"),
                       [{"model": model, "entry_id": e, "conversation_id": c, "vec": v,
                         "created_at": t} for e, c, v in rows])


# -- search ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Near:
    id: int
    similarity: float
    kind: str
    author: str | None
    created_at: float


def _scope_sql(dialect: str, conversation_ids: list[int] | None, params: dict, *,
               by_index: bool = True) -> str:
    """The scope as a condition on `v`; `by_index=False`: a filter only, never the index
    SQLite reads by (the `+`), for rows found by their ids."""
    if conversation_ids is None:
        return ""
    if dialect == "postgresql":
        params["cids"] = conversation_ids
        return " AND v.conversation_id = ANY(CAST(:cids AS bigint[]))"
    params["cids"] = json.dumps(conversation_ids)
    plus = "" if by_index else "+"
    return f" AND {plus}v.conversation_id IN (SELECT value FROM json_each(:cids))"


class _Top:
    """The best `k` (similarity, id) seen so far, over chunks of vectors (numpy)."""

    def __init__(self, query: list[float], k: int):
        import numpy as np

        self.np, self.k = np, k
        q = np.asarray(query, dtype=np.float32)
        self.q = q / (float(np.linalg.norm(q)) or 1.0)
        self.sims = np.empty(0, dtype=np.float32)
        self.ids = np.empty(0, dtype=np.int64)

    def add(self, ids: list[int], blobs: list[bytes]) -> None:
        np, width = self.np, 4 * len(self.q)
        keep = [i for i, b in enumerate(blobs) if len(b) == width]
        if not keep:
            return
        if len(keep) < len(blobs):
            ids, blobs = [ids[i] for i in keep], [blobs[i] for i in keep]
        m = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), len(self.q))
        sims = np.concatenate([self.sims, m @ self.q])
        idx = np.concatenate([self.ids, np.asarray(ids, dtype=np.int64)])
        if len(sims) > self.k:  # best k: highest similarity, then the newest id
            cut = np.argpartition(-sims, self.k - 1)[:self.k]
            sims, idx = sims[cut], idx[cut]
        self.sims, self.ids = sims, idx

    def best(self) -> list[tuple[int, float]]:
        return sorted(zip(self.ids.tolist(), self.sims.tolist(), strict=True),
                      key=lambda p: (-p[1], -p[0]))


async def _rows(conn, found: list[tuple[int, float]]) -> list[Near]:
    if not found:
        return []
    ids = {f"i{n}": entry_id for n, (entry_id, _) in enumerate(found)}
    rows = (await run(conn, (
        f"SELECT id, kind, author, created_at FROM entries "
        f"WHERE id IN ({', '.join(':' + k for k in ids)})"), ids)).all()
    by_id = {r.id: r for r in rows}
    return [Near(i, s, by_id[i].kind, by_id[i].author, by_id[i].created_at)
            for i, s in found if i in by_id]


async def _exact(conn, dialect: str, model: str, query: list[float], k: int,
                 conversation_ids: list[int] | None, newest: int | None = None
                 ) -> list[tuple[int, float]]:
    """Every vector of the scope (or its `newest` ones) compared, `CHUNK` rows at a time
    (keyset on the scope index, newest first)."""
    top, params = _Top(query, k), {"model": model, "n": CHUNK}
    scope = _scope_sql(dialect, conversation_ids, params)
    # SQLite would walk the model's primary key newest first, filtering every row it reads
    # by conversation (~0.6 s over 10^5 rows for a conversation of 1000): the scope index
    # reads only the scope's rows, sorted per chunk.
    hint = (" INDEXED BY ix_entry_vectors_scope"
            if dialect == "sqlite" and conversation_ids is not None else "")
    before, seen = None, 0
    while newest is None or seen < newest:
        params["n"] = CHUNK if newest is None else min(CHUNK, newest - seen)
        page = " AND v.entry_id < :before" if before is not None else ""
        params["before"] = before
        rows = (await run(conn, (
            f"SELECT v.entry_id, v.vec FROM entry_vectors AS v{hint} WHERE v.model = :model "
            f"AND v.vec IS NOT NULL{scope}{page} ORDER BY v.entry_id DESC LIMIT :n"),
            params)).all()
        if not rows:
            break
        ids, blobs = [r[0] for r in rows], [bytes(r[1]) for r in rows]
        await asyncio.to_thread(top.add, ids, blobs)
        before, seen = ids[-1], seen + len(rows)
        if len(rows) < params["n"]:
            break
    return top.best()


async def _count(conn, dialect: str, model: str, conversation_ids: list[int] | None,
                 cap: int) -> int:
    """The scope's rows of `model`, counted up to `cap` from the scope index alone. Refused
    entries (NULL vectors, rare) count too: asking for `vec` read every row's page, ~30 ms
    of each whole-store search at 10^5; a count a little high only sends a scope just
    under the window through the index, which is as exact there (hits re-scored, short of
    k the exact search)."""
    params = {"model": model, "cap": cap}
    scope = _scope_sql(dialect, conversation_ids, params)
    return (await run(conn, (
        f"SELECT count(*) FROM (SELECT 1 FROM entry_vectors AS v WHERE v.model = :model"
        f"{scope} LIMIT :cap) AS s"), params)).scalar()


async def _rescored(conn, dialect: str, model: str, query: list[float], k: int,
                    conversation_ids: list[int] | None, ids: list[int]
                    ) -> list[tuple[int, float]]:
    """Candidates from an index, kept only if they are in the scope (SQL), re-scored from
    their stored vectors."""
    top, params = _Top(query, k), {"model": model}
    scope = _scope_sql(dialect, conversation_ids, params, by_index=False)
    if dialect == "postgresql":
        params["ids"], cand = ids, "v.entry_id = ANY(CAST(:ids AS bigint[]))"
    else:
        params["ids"], cand = json.dumps(ids), "v.entry_id IN (SELECT value FROM json_each(:ids))"
    rows = (await run(conn, (
        f"SELECT v.entry_id, v.vec FROM entry_vectors AS v WHERE v.model = :model "
        f"AND v.vec IS NOT NULL AND {cand}{scope}"), params)).all()
    await asyncio.to_thread(top.add, [r[0] for r in rows], [bytes(r[1]) for r in rows])
    return top.best()


def _pg_order(pg: _Pg) -> str:
    s, dim = pg.schema, pg.dim
    return (f'CAST(v.embedding AS "{s}".vector({dim})) OPERATOR("{s}".<#>) '
            f'CAST(:q AS "{s}".vector({dim}))')


def _pg_query(query: list[float]) -> str:
    return "[" + ",".join(repr(float(x)) for x in query) + "]"


async def _pg_hnsw(conn, pg: _Pg, model: str, query: list[float], k: int,
                   conversation_ids: list[int] | None) -> list[int]:
    """Candidates from the HNSW index with the scope as its filter; iterative scan, so that
    a filter that drops most candidates still yields k (up to `hnsw.max_scan_tuples`)."""
    params = {"q": _pg_query(query), "k": k}
    scope = _scope_sql("postgresql", conversation_ids, params)
    await run(conn, "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true), "
                    "set_config('hnsw.ef_search', :ef, true)",
              {"ef": str(min(1000, max(100, 2 * k)))})
    rows = (await run(conn, (
        f"SELECT v.entry_id FROM entry_vectors AS v WHERE v.model = {_quoted(model)}{scope} "
        f"ORDER BY {_pg_order(pg)} LIMIT :k"), params)).all()
    return [r[0] for r in rows]


async def explain(conn, model: str, query: list[float], *, k: int,
                  conversation_ids: list[int] | None) -> str:
    """PostgreSQL's plan for the HNSW search of a large scope (tests read it)."""
    pg = await _pg(conn, model)
    params = {"q": _pg_query(query), "k": k}
    scope = _scope_sql("postgresql", conversation_ids, params)
    rows = await run(conn, (
        f"EXPLAIN SELECT v.entry_id FROM entry_vectors AS v WHERE v.model = {_quoted(model)}"
        f"{scope} ORDER BY {_pg_order(pg)} LIMIT :k"), params)
    return "\n".join(r[0] for r in rows)


async def _pg_exact(conn, pg: _Pg, model: str, query: list[float], k: int,
                    conversation_ids: list[int] | None) -> list[tuple[int, float]]:
    """Exact in the server: every vector of the scope (read by the scope index) compared;
    `+ 0` keeps the HNSW index out of it."""
    params = {"q": _pg_query(query), "k": k, "model": model}
    scope = _scope_sql("postgresql", conversation_ids, params)
    rows = (await run(conn, (
        f"SELECT v.entry_id, -({_pg_order(pg)}) AS sim FROM entry_vectors AS v "
        f"WHERE v.model = :model AND v.embedding IS NOT NULL{scope} "
        f"ORDER BY ({_pg_order(pg)}) + 0, v.entry_id DESC LIMIT :k"), params)).all()
    return [(r[0], float(r[1])) for r in rows]


async def nearest(conn, dialect: str, model: str, query: list[float], *,
                  conversation_ids: list[int] | None, k: int,
                  window: int = VECTOR_WINDOW, index_dir=None) -> list[Near]:
    """The `k` entries most similar to `query` among the embedded entries of the given
    conversations (None: all), best first (ties: the newest). Exact for a scope of up to
    `window` embedded entries; beyond, through an index when there is one (else exact
    over the scope's newest `window`)."""
    if conversation_ids == [] or k <= 0 or not query:
        return []
    pg = await _pg(conn, model) if dialect == "postgresql" else None
    if pg is not None and (pg.schema is None or pg.dim != len(query)):
        pg = None  # no pgvector, or vectors of another length than the index's
    n = await _count(conn, dialect, model, conversation_ids, window + 1)
    if n <= window:
        if pg is not None:
            return await _rows(conn, await _pg_exact(conn, pg, model, query, k,
                                                     conversation_ids))
        return await _rows(conn, await _exact(conn, dialect, model, query, k,
                                              conversation_ids))
    found = None
    if pg is not None:
        ids = await _pg_hnsw(conn, pg, model, query, k, conversation_ids)
        found = await _rescored(conn, dialect, model, query, k, conversation_ids, ids)
        if len(found) < k:  # the filter left too few within the scan's bound
            found = await _pg_exact(conn, pg, model, query, k, conversation_ids)
    elif dialect == "sqlite":
        from store import vector_index

        found = await vector_index.nearest(conn, model, query, k, conversation_ids,
                                           rescore=_rescored, directory=index_dir)
    if found is None:
        found = await _exact(conn, dialect, model, query, k, conversation_ids, newest=window)
    return await _rows(conn, found)
