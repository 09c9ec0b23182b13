"""The local model's speed (issue 37, "vectors that are cheap enough"): how many texts a
second it embeds on this machine's cores, and a hybrid search at 10^5 entries in a warm
process, both with the machine's load average beside them (the machine may be shared).

1. Throughput, on the same texts in the same run (the turns of bench/recall.py's two
   corpora, "speaker: text", as the embedding task sends them), rounds interleaved, the
   median of --rounds:
     1 thread         `MiniLM.encode` in the calling thread (one BLAS thread), as a
                      question is embedded
     2 workers        `LocalEmbedder.embed`, as the background task calls it: the texts
                      shared out between its `WORKERS` threads, niced (`NICE`)
     2 workers, nice 0  the same threads without the lower priority (a bench-only pool)
     2 BLAS threads   one thread, OpenBLAS given two (threadpoolctl, for the call)
   Texts/s of wall clock and per CPU-second of the process (`time.process_time`), and
   each one's wall ratio to "1 thread". On a loaded machine the niced workers get little:
   what they yield is the point; the per-CPU-second figure says what the work costs.
2. Hybrid search, through `remember` (what the search tool, `steward search` and the
   automatic recall call) with the real `LocalEmbedder` (hybrid on, read and warmed
   first, as `steward run` does at start-up): the question's embedding, the vector search,
   the lexical search and their fusion, p50/p99 over --queries questions of bench/
   recall.py, within one conversation and over the whole store, at --n entries (100
   conversations; texts cycled from the corpora; each entry's vector is its text's real
   vector plus a little noise, stored in bulk, the index built before the timings:
   SQLite's usearch file, PostgreSQL's HNSW after a VACUUM ANALYZE, as autovacuum would).
   The question's embedding alone is timed too.

usage: .venv/bin/python bench/embed_speed.py [--backend sqlite|postgres|both|none]
           [--n 100000] [--texts 2000] [--rounds 3] [--queries 100] [--json]
"""

import argparse
import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __name__ == "__main__":  # this directory first on sys.path would shadow `store`
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import numpy as np  # noqa: E402
from sqlalchemy import text  # noqa: E402

from bench.recall import casual_corpus, corpus  # noqa: E402
from bench.store import postgres_url, sqlite_url  # noqa: E402
from bot.memory import embeddings as _embeddings  # noqa: E402
from bot.memory import local_model  # noqa: E402
from bot.memory.retrieval import remember  # noqa: E402
from store import open_store, vector_index  # noqa: E402
from store import vectors as _vectors  # noqa: E402
from store.read.plain import run  # noqa: E402

CONVERSATIONS = 100


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def turns() -> tuple[list[str], list[str]]:
    """The corpora's turns as embedded ("speaker: text"), and their questions."""
    rows, questions = corpus(5, 2)
    rows2, questions2 = casual_corpus(5, 2)
    texts = [_vectors.embeddable_text(r.get("author"), r["text"]) for r in rows + rows2
             if r["text"].strip()]
    return texts, [q.text for q in questions + questions2]


# -- 1. throughput ---------------------------------------------------------------------------


def throughput(model, texts: list[str], rounds: int) -> dict:
    from threadpoolctl import threadpool_limits

    embedder = _embeddings.LocalEmbedder(batch_size=64)
    plain = ThreadPoolExecutor(_embeddings.WORKERS, thread_name_prefix="bench")

    def background():  # as the embedding task asks: batches of 64, the niced threads
        return embedder._embed(texts, False)

    def unniced():
        return [model.encode(texts[i:i + 64], pool=plain, parts=_embeddings.WORKERS)
                for i in range(0, len(texts), 64)]

    def blas2():
        with threadpool_limits(2, user_api="blas"):
            return model.encode(texts)

    ways = {"1 thread": lambda: model.encode(texts),
            f"{_embeddings.WORKERS} workers": background,
            f"{_embeddings.WORKERS} workers, nice 0": unniced,
            "2 BLAS threads": blas2}
    model.encode(texts[:64])
    background()  # the pools' threads made
    unniced()
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for _ in range(rounds):
        for name, way in ways.items():
            cpu, wall = time.process_time(), time.perf_counter()
            way()
            seen[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    plain.shutdown()
    out = {}
    for name, times in seen.items():
        wall = float(np.median([w for w, _ in times]))
        cpu = float(np.median([c for _, c in times]))
        out[name] = {"wall_per_s": len(texts) / wall, "per_cpu_s": len(texts) / cpu}
    base = out["1 thread"]["wall_per_s"]
    for row in out.values():
        row["wall_ratio"] = row["wall_per_s"] / base
    return out


# -- 2. hybrid search at --n entries ----------------------------------------------------------


async def fill(store, texts: list[str], vectors: np.ndarray, n: int) -> None:
    """n entries over `CONVERSATIONS` conversations, texts cycled, and their vectors."""
    rng = np.random.default_rng(3)
    per = n // CONVERSATIONS
    cids = []
    for c in range(CONVERSATIONS):
        conv = await store.ensure_conversation(f"cli:speed-{c}", owner="pat",
                                               scope="private:pat")
        cids.append(conv.id)
    t0 = 1_700_000_000
    async with store.engines.write.begin() as conn:
        for c, cid in enumerate(cids):
            rows = [{"c": cid, "s": i + 1, "k": "user" if i % 2 == 0 else "assistant",
                     "a": "pat", "x": texts[(c * per + i) % len(texts)].split(": ", 1)[-1],
                     "t": t0 + c * per + i} for i in range(per)]
            await conn.execute(text(
                "INSERT INTO entries (conversation_id, seq, kind, author, text, created_at) "
                "VALUES (:c, :s, :k, :a, :x, :t)"), rows)
    async with store.engines.read.connect() as conn:
        ids = [tuple(r) for r in await conn.execute(text(
            "SELECT id, conversation_id FROM entries ORDER BY conversation_id, seq"))]
    pg = None
    if store.dialect == "postgresql":
        async with store.engines.read.connect() as conn:
            pg = (await _vectors._pg(conn, local_model.MODEL)).schema
    for lo in range(0, len(ids), 5000):
        part = ids[lo:lo + 5000]
        m = vectors[[i % len(texts) for i in range(lo, lo + len(part))]]
        m = m + 0.02 * rng.standard_normal(m.shape).astype(np.float32) / np.sqrt(m.shape[1])
        m /= np.linalg.norm(m, axis=1, keepdims=True)
        blobs = [v.astype("<f4").tobytes() for v in m]
        async with store.engines.write.begin() as conn:
            if store.dialect == "sqlite":
                await conn.execute(text(
                    "INSERT INTO entry_vectors (model, entry_id, conversation_id, vec, "
                    "created_at) VALUES (:m, :e, :c, :v, 0)"),
                    [{"m": local_model.MODEL, "e": e, "c": c, "v": b}
                     for (e, c), b in zip(part, blobs, strict=True)])
            else:
                await conn.execute(text(
                    "INSERT INTO entry_vectors (model, entry_id, conversation_id, vec, "
                    "created_at, embedding) SELECT :m, u.e, u.c, u.v, 0, CAST(u.x AS real[]) "
                    "FROM unnest(CAST(:es AS bigint[]), CAST(:cs AS bigint[]), "
                    "CAST(:vs AS bytea[]), CAST(:xs AS text[])) AS u(e, c, v, x)"),
                    {"m": local_model.MODEL, "es": [e for e, _ in part],
                     "cs": [c for _, c in part], "vs": blobs,
                     "xs": ["{" + ",".join(map(repr, v.tolist())) + "}" for v in m]
                     if pg else [None] * len(part)})
    if store.dialect == "postgresql":
        if pg:
            async with store.engines.write.begin() as conn:
                await conn.execute(text("SET LOCAL maintenance_work_mem = '1GB'"))
                await run(conn, _vectors.index_sql(pg, local_model.MODEL, vectors.shape[1]))
        async with store.engines.write.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("VACUUM ANALYZE entries, entry_vectors, conversations")
    async with store.reading() as conn:  # SQLite: the index file written (in a thread)
        await _vectors.nearest(conn, store.dialect, local_model.MODEL,
                               vectors[0].tolist(), conversation_ids=None, k=10)
    await vector_index.idle()


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs) * 1000.0, p))


async def hybrid(backend: str, texts, vectors, questions, args) -> dict:
    urls = {"sqlite": sqlite_url, "postgres": postgres_url}
    async with urls[backend]() as url:
        store = await open_store(url)
        try:
            t = time.perf_counter()
            await fill(store, texts, vectors, args.n)
            built = time.perf_counter() - t
            embedder = _embeddings.LocalEmbedder(hybrid=True)
            out = {"backend": backend, "n": args.n, "fill_s": built}
            lat = []
            for q in questions[:args.queries]:
                t = time.perf_counter()
                await embedder.embed([q])
                lat.append(time.perf_counter() - t)
            out["question embedding"] = {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}
            for name, kwargs in (("conversation", {"conversation_key": "cli:speed-1"}),
                                 ("store", {})):
                await remember(store, questions[0], embedder=embedder, **kwargs)
                lat = []
                for q in questions[:args.queries]:
                    t = time.perf_counter()
                    await remember(store, q, limit=10, embedder=embedder, **kwargs)
                    lat.append(time.perf_counter() - t)
                out[f"hybrid, {name}"] = {"p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}
            out["load average"] = load_average()
            return out
        finally:
            await store.close()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["sqlite", "postgres", "both", "none"],
                   default="both")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--texts", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--queries", type=int, default=100)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    texts, questions = turns()
    result = {"cores": len(os.sched_getaffinity(0)), "load average before": load_average()}
    t = time.perf_counter()
    model = local_model.load()
    result["model load_s"] = time.perf_counter() - t
    sample = texts[:args.texts]
    result["texts"] = len(sample)
    result["mean tokens"] = float(np.mean([len(e.ids) for e in
                                           model.tokenizer.encode_batch(sample)]))
    result["throughput"] = throughput(model, sample, args.rounds)
    result["load average after throughput"] = load_average()
    if not args.json:
        print(f"{result['cores']} cores; model read in {result['model load_s']:.2f} s; "
              f"{len(sample)} texts, {result['mean tokens']:.1f} tokens each on average")
        print(f"load average before: {result['load average before']}, after: "
              f"{result['load average after throughput']}")
        print(f"  {'':22} {'texts/s wall':>12} {'per CPU-s':>10} {'wall ratio':>10}")
        for name, row in result["throughput"].items():
            print(f"  {name:22} {row['wall_per_s']:12.0f} {row['per_cpu_s']:10.0f} "
                  f"{row['wall_ratio']:9.2f}x")
    backends = {"both": ["sqlite", "postgresql"], "none": [], "sqlite": ["sqlite"],
                "postgres": ["postgresql"]}[args.backend]
    if backends:
        distinct = list(dict.fromkeys(texts))
        vectors = model.encode(distinct)
        result["hybrid"] = []
        for backend in backends:
            r = await hybrid(backend, distinct, vectors, questions, args)
            result["hybrid"].append(r)
            if not args.json:
                print(f"\n{backend}: {r['n']} entries (filled and indexed in "
                      f"{r['fill_s']:.0f} s); load average {r['load average']}")
                for name in ("question embedding", "hybrid, conversation", "hybrid, store"):
                    print(f"  {name:22} p50 {r[name]['p50_ms']:7.1f} ms   "
                          f"p99 {r[name]['p99_ms']:7.1f} ms")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
