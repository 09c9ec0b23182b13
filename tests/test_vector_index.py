"""The vector search behind hybrid recall, on both backends: exact within a scope of up to
`VECTOR_WINDOW` entries, an index beyond (pgvector's HNSW on PostgreSQL, a usearch file on
SQLite), older entries found, and never a hit outside the given conversations."""

import numpy as np
import pytest
from sqlalchemy import text

from store import vector_index
from store import vectors as _vectors
from store.engine import create_engines, migrate

MODEL = "test-model:v1"  # a colon and all: the model is inlined as a literal on PostgreSQL
DIM = 16


def unit(rng, n, dim=DIM):
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


async def bulk_entries(conn, dialect, cid, n, *, at=1_700_000_000):
    """`n` user entries in conversation `cid`, returning their ids in order."""
    gen = ("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n) "
           "SELECT i FROM s" if dialect == "sqlite" else "SELECT generate_series(1, :n) AS i")
    start = (await conn.execute(text(
        "SELECT coalesce(max(seq), 0) FROM entries WHERE conversation_id = :c"),
        {"c": cid})).scalar()
    await conn.execute(text(
        f"INSERT INTO entries (conversation_id, seq, kind, author, text, created_at) "
        f"SELECT :c, :s + i, 'user', 'ann', 'note ' || i, :at + i FROM ({gen}) AS g"),
        {"c": cid, "s": start, "n": n, "at": at})
    return [r[0] for r in await conn.execute(text(
        "SELECT id FROM entries WHERE conversation_id = :c AND seq > :s ORDER BY seq"),
        {"c": cid, "s": start})]


async def fill(store, key, vecs, *, model=MODEL):
    """A conversation whose entries carry `vecs`; returns (conversation id, entry ids)."""
    conv = await store.ensure_conversation(key, owner=key)
    async with store.engines.write.begin() as conn:
        ids = await bulk_entries(conn, store.dialect, conv.id, len(vecs))
        for lo in range(0, len(ids), 2000):
            await _vectors.put(conn, store.dialect, model, [
                (e, conv.id, v.astype("<f4").tobytes())
                for e, v in zip(ids[lo:lo + 2000], vecs[lo:lo + 2000], strict=True)])
    return conv.id, ids


def brute(ids, vecs, q, k):
    sims = vecs @ (q / np.linalg.norm(q))
    order = sorted(range(len(ids)), key=lambda i: (-sims[i], -ids[i]))[:k]
    return [ids[i] for i in order]


async def near(store, q, cids, k, **kw):
    async with store.reading() as conn:
        return await _vectors.nearest(conn, store.dialect, MODEL, list(map(float, q)),
                                      conversation_ids=cids, k=k, **kw)


async def test_results_are_exact_within_a_conversation(store):
    rng = np.random.default_rng(1)
    a_vecs, b_vecs = unit(rng, 3000), unit(rng, 3000)
    a, a_ids = await fill(store, "cli:a", a_vecs)
    b, b_ids = await fill(store, "cli:b", b_vecs)
    for q in unit(rng, 5):
        got = await near(store, q, [a], 20)
        assert [n.id for n in got] == brute(a_ids, a_vecs, q, 20)
        assert got[0].similarity == pytest.approx(float(a_vecs[a_ids.index(got[0].id)] @ q),
                                                  abs=1e-5)
        both = await near(store, q, [a, b], 10)
        assert [n.id for n in both] == brute(a_ids + b_ids, np.vstack([a_vecs, b_vecs]), q, 10)


@pytest.mark.parametrize("window", [_vectors.VECTOR_WINDOW, 500])  # exact; by the index
async def test_a_scope_never_returns_another_conversations_closer_vectors(store, window):
    rng = np.random.default_rng(2)
    q = unit(rng, 1)[0]
    secret = np.vstack([q] * 50) + 0.01 * unit(rng, 50)  # all far closer than the rest
    secret /= np.linalg.norm(secret, axis=1, keepdims=True)
    _, secret_ids = await fill(store, "slack:T:D-secret", np.vstack([secret, unit(rng, 1500)]))
    mine_vecs = unit(rng, 2000)
    mine, mine_ids = await fill(store, "cli:mine", mine_vecs)
    for k in (1, 10, 50):
        got = await near(store, q, [mine], k, window=window)
        assert len(got) == k
        assert not {n.id for n in got} & set(secret_ids)
        assert {n.id for n in got} <= set(mine_ids)
    everything = await near(store, q, None, 10, window=window)
    assert {n.id for n in everything} <= set(secret_ids[:50])  # the closest, found by all
    assert await near(store, q, [], 10, window=window) == []


async def test_an_entry_older_than_the_old_window_is_found(store, monkeypatch):
    """25 000 embedded entries: the oldest is beyond the newest-20 000 window the search
    once read, and is found by the index, from the whole store and from its scope.
    (PostgreSQL: loaded first and indexed after, as migration 0013 does; inserting into
    the index row by row is tested by the other tests.)"""
    rng = np.random.default_rng(3)
    vecs = unit(rng, 25_000)
    if store.dialect == "postgresql":
        async with store.reading() as conn:
            schema = (await _vectors._pg(conn, MODEL)).schema

        async def later(conn, model, dim):
            return _vectors._Pg(schema, dim)

        monkeypatch.setattr(_vectors, "ensure_pg_index", later)
    big, ids = await fill(store, "cli:big", vecs)
    if store.dialect == "postgresql":
        monkeypatch.undo()
        async with store.engines.write.begin() as conn:
            await conn.execute(text(_vectors.index_sql(schema, MODEL, DIM)))
    await fill(store, "cli:other", unit(rng, 100))
    # SQLite: the first search starts the index's build in the background and is answered
    # at once by the exact path (the newest vectors); later ones use the index.
    await near(store, vecs[0], None, 10)
    await vector_index.idle()
    for i in (0, 1, 2):
        q = vecs[i] + 0.05 * unit(rng, 1)[0]
        for scope in (None, [big]):
            got = await near(store, q, scope, 10)
            assert got[0].id == ids[i], (scope, i)
            assert len(got) == 10


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)  # pgvector is PostgreSQL's
async def test_postgres_searches_a_large_scope_through_hnsw(store):
    rng = np.random.default_rng(4)
    conv, ids = await fill(store, "cli:big", unit(rng, 3000))
    q = unit(rng, 1)[0]
    async with store.reading() as conn:
        pg = await _vectors._pg(conn, MODEL)
        assert pg.schema == "public" and pg.dim == DIM  # made with the first vectors
        await conn.execute(text("ANALYZE entry_vectors"))
        plan = await _vectors.explain(conn, MODEL, list(map(float, q)), k=10,
                                      conversation_ids=[conv])
    assert "ix_entry_vectors_hnsw_" in plan, plan
    got = await near(store, q, [conv], 10, window=100)  # the HNSW path
    exact = await near(store, q, [conv], 10)
    assert len({n.id for n in got} & {n.id for n in exact}) >= 8
    assert {n.id for n in got} <= set(ids)


async def test_without_an_index_the_search_stays_exact_over_the_window(store, monkeypatch):
    """PostgreSQL without pgvector (forced) and SQLite without an index file (a database
    in memory): exact within the window, the newest `window` entries beyond it."""
    rng = np.random.default_rng(5)
    vecs = unit(rng, 1200)
    conv, ids = await fill(store, "cli:c", vecs)
    monkeypatch.setattr(_vectors, "_pg", _no_pgvector)

    async def no_index(*args, **kwargs):
        return None

    monkeypatch.setattr(vector_index, "nearest", no_index)
    q = unit(rng, 1)[0]
    got = await near(store, q, [conv], 15)
    assert [n.id for n in got] == brute(ids, vecs, q, 15)
    newest = await near(store, q, [conv], 15, window=400)
    assert [n.id for n in newest] == brute(ids[-400:], vecs[-400:], q, 15)


async def _no_pgvector(conn, model):
    return _vectors._Pg(None, None)


async def test_the_migration_fills_the_index_of_a_store_with_vectors(store_url):
    """A store at 0012 with vectors: 0013 adds `embedding`, fills it from `vec` in batches
    (PostgreSQL with pgvector) and indexes each model; the search is exact after it."""
    rng = np.random.default_rng(6)
    vecs = unit(rng, 4500)
    engines = create_engines(store_url)
    try:
        await migrate(engines, "0012")
        async with engines.write.begin() as conn:
            await conn.execute(text(
                "INSERT INTO conversations (key, owner, last_seq, meta, scope, created_at, "
                "updated_at) VALUES ('cli:old', 'me', 0, '{}', 'private:me', 0, 0)"))
            cid = (await conn.execute(text("SELECT id FROM conversations"))).scalar()
            ids = await bulk_entries(conn, engines.dialect, cid, len(vecs))
            await conn.execute(text(
                "INSERT INTO entry_vectors (model, entry_id, conversation_id, vec, created_at) "
                "VALUES (:m, :e, :c, :v, 0)"),
                [{"m": MODEL, "e": e, "c": cid, "v": v.astype("<f4").tobytes()}
                 for e, v in zip(ids, vecs, strict=True)])
        await migrate(engines)
        async with engines.read.connect() as conn:
            filled = (await conn.execute(text(
                "SELECT count(*) FROM entry_vectors WHERE embedding IS NOT NULL"))).scalar()
            q = list(map(float, unit(rng, 1)[0]))
            got = await _vectors.nearest(conn, engines.dialect, MODEL, q,
                                         conversation_ids=[cid], k=10)
            if engines.dialect == "postgresql":
                assert (await _vectors._pg(conn, MODEL)).dim == DIM
        assert filled == (len(vecs) if engines.dialect == "postgresql" else 0)
        assert [n.id for n in got] == brute(ids, vecs, np.asarray(q), 10)
    finally:
        await engines.dispose()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # the index file is SQLite's
async def test_the_sqlite_index_file_catches_up_and_is_rebuilt_from_the_table(
        store, tmp_path, monkeypatch):
    monkeypatch.setattr(vector_index, "TAIL_MAX", 300)
    monkeypatch.setattr(vector_index, "READ", 250)
    monkeypatch.setattr(vector_index, "_OPEN", {})
    rng = np.random.default_rng(7)
    vecs = unit(rng, 1000)
    conv, ids = await fill(store, "cli:c", vecs)
    directory = tmp_path / "steward.db-vectors"
    q = vecs[5]
    await near(store, q, None, 5, window=100)  # starts the build; the exact path answers
    await vector_index.idle()
    assert (await near(store, q, None, 5, window=100))[0].id == ids[5]
    files = sorted(directory.glob("*.usearch"))
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    more = unit(rng, 200)  # fewer than TAIL_MAX: searched from the tail, exactly
    _, more_ids = await fill(store, "cli:d", more)
    assert (await near(store, more[7], None, 5, window=100))[0].id == more_ids[7]
    assert sorted(directory.glob("*.usearch")) == files
    # a torn file (as a kill mid-write would leave under the temporary name, never this
    # one) and a process starting afresh: the file is rebuilt from the table
    files[0].write_bytes(files[0].read_bytes()[:1000])
    (directory / f".{files[0].name.split('.')[0]}.999.1.tmp").write_bytes(b"partial")
    monkeypatch.setattr(vector_index, "_OPEN", {})
    everything = np.vstack([vecs, more])
    await near(store, q, None, 5, window=100)
    await vector_index.idle()
    for i in (3, 1100):
        got = await near(store, everything[i], None, 5, window=100)
        assert got[0].id == (ids + more_ids)[i]
    got = await near(store, q, [conv], 20, window=100)
    assert {n.id for n in got} <= set(ids)


_REBUILDER = r"""
import asyncio, sys
import numpy as np
from store import open_store, vector_index
from store import vectors as _vectors

vector_index.TAIL_MAX, vector_index.READ = 40, 30  # a rebuild every other round

async def main(url):
    store = await open_store(url)
    conv = await store.ensure_conversation("cli:k")
    rng = np.random.default_rng(int(sys.argv[2]))
    while True:
        from tests.test_vector_index import bulk_entries, unit
        vecs = unit(rng, 25)
        async with store.engines.write.begin() as conn:
            ids = await bulk_entries(conn, "sqlite", conv.id, 25)
            await _vectors.put(conn, "sqlite", "test-model:v1", [
                (e, conv.id, v.astype("<f4").tobytes()) for e, v in zip(ids, vecs)])
        async with store.reading() as conn:
            await _vectors.nearest(conn, "sqlite", "test-model:v1", list(map(float, vecs[0])),
                                   conversation_ids=None, k=5, window=10)
        print("round", flush=True)

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # the index file is SQLite's
async def test_a_kill_while_the_sqlite_index_is_rewritten_loses_no_vector(
        store, store_url, tmp_path, monkeypatch):
    """SIGKILL at chosen instants of a process that rebuilds the index file every other
    round: the file left (or none) is whole, and a search afterwards finds every vector
    stored, exactly as the table has it."""
    import asyncio
    import os
    import signal
    import sys

    root = str(__import__("pathlib").Path(__file__).resolve().parent.parent)
    for seed, rounds in ((1, 3), (2, 6), (3, 9)):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _REBUILDER, store_url, str(seed), cwd=root,
            stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": root})
        for _ in range(rounds):
            await asyncio.wait_for(proc.stdout.readline(), 60)
        await asyncio.sleep(0.01 * seed)  # somewhere in the next round: a rebuild, or not
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    monkeypatch.setattr(vector_index, "_OPEN", {})  # as a process starting afresh
    async with store.reading() as conn:
        rows = (await conn.execute(text(
            "SELECT entry_id, vec FROM entry_vectors ORDER BY entry_id"))).all()
    ids = [r[0] for r in rows]
    vecs = np.vstack([np.frombuffer(r[1], dtype="<f4") for r in rows])
    assert len(ids) >= 3 * 3 * 25
    for i in range(0, len(ids), 37):
        got = await near(store, vecs[i], None, 3, window=10)
        assert got[0].id == ids[i]
    directory = tmp_path / "steward.db-vectors"  # the newest file, and perhaps the one
    assert 1 <= len(list(directory.glob("*.usearch"))) <= 2  # it replaced (killed between)
