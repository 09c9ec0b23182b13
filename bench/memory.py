"""Memory benchmark (issue 7), SQLite and PostgreSQL: years of history must make neither a
turn slower nor the process bigger.

Each backend gets one store with --idle idle conversations (3 entries each) and, built in
turn, one conversation per size in --sizes, all bulk-inserted on the server (the full-text
trigger or generated column indexes them as it would live writes: part of the build time).
Entries alternate user / assistant, varied text from a Zipf-distributed vocabulary, ~470
characters on average, so even the smallest history overflows the realistic window
(context_window 128000, max_output 4096: ~370 000 characters) and every size fills it.
PostgreSQL is ANALYZEd after each build, as autovacuum would do shortly after.

1. context assembly, `build_request` in 5 fresh processes per size (medians):
   the first call (cold), the median of 20 with a `ContextCache` (warm), the RSS growth
   of the first call (VmHWM reset through /proc/self/clear_refs) and tracemalloc's peak of
   an uncached call in a new handle. The largest size must stay within 1.5x of the
   smallest, else FAIL (and exit status 1).
2. search, `Store.search(q, limit=10)` right after each size is built: p50/p99 of ~50
   queries (rare words, ticket numbers, common words, two words, phrases, no match) x3,
   across all conversations, within the new conversation's scope, and within a small
   old scope (one person's 60 idle entries: the index holds everyone else's first).
3. import: a JSONL file (DESIGN.md format) into a fresh store through `import_file`, then
   the same file again (idempotent: nothing new) and how long that no-op pass takes.

usage: .venv/bin/python bench/memory.py [--backend sqlite|postgres|both]
           [--sizes 1000,100000,1000000] [--idle 10000] [--import-lines 100000] [--json]
"""

import argparse
import asyncio
import gc
import json
import logging
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from datetime import UTC, datetime
from itertools import accumulate
from pathlib import Path

from sqlalchemy import text

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.store import _proc_status, fmt, fresh_store, note, p50_p99, postgres_url, sqlite_url  # noqa: E402
from bot.agent.context import ContextCache, build_request  # noqa: E402
from bot.app.config import build_config  # noqa: E402
from bot.app.importers import import_file  # noqa: E402
from bot.app.wiring import build_toolbox  # noqa: E402
from store import Store, open_store  # noqa: E402

LIMIT = 1.5  # the largest history's figures over the smallest's, at most
BATCH = 100_000  # entries per build transaction
WARM_RUNS, PROBES, SEARCH_ROUNDS = 20, 5, 3
POOL = 4096  # paragraphs entries are made of
PRIMES = (4093, 4091, 4079, 4073, 4057)  # a paragraph slot each: combinations never repeat
MULTS = (40503, 7919, 99991, 65537, 31337)
YEARS = 5  # the largest history spans this long; smaller ones end now at the same pace
COMMON = ("the to and a of I you it for is on that in we can this with be have will at "
          "please meeting thursday invoice draft review agenda budget quarter client project "
          "deadline summary notes call tomorrow friday email send office team report flight "
          "hotel dinner sister graz doctor appointment vpn password reminder").split()
SYLLABLES = "ka lo mi ne ru ta so vi de pa gor lin est ber wan tul mar fen dri os".split()
NO_MATCH = ("zqxvort", "blimfrazzle", "qwyxtrop")
SMALL_SCOPE = "private:person1"  # 20 idle conversations, 60 entries, 400 days old


def vocabulary(rng: random.Random, size: int = 5000) -> list[str]:
    """COMMON first, then invented words: the order is the Zipf rank."""
    words, seen = list(COMMON), set(COMMON)
    while len(words) < size:
        w = "".join(rng.choices(SYLLABLES, k=rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def paragraphs(rng: random.Random, words: list[str]) -> list[str]:
    weights = list(accumulate(1 / (r + 1) for r in range(len(words))))
    out = []
    for _ in range(POOL):
        sentences = []
        for _ in range(rng.randint(1, 4)):
            s = " ".join(rng.choices(words, cum_weights=weights, k=rng.randint(5, 16)))
            sentences.append(s[0].upper() + s[1:] + rng.choice(".?."))
        out.append(" ".join(sentences))
    return out


def series(dialect: str, lo: str, hi: str) -> tuple[str, str]:
    """(WITH clause, FROM item) for the rows s(i), i = lo..hi."""
    if dialect == "postgresql":
        return "", f"generate_series({lo}, {hi}) AS s(i)"
    return (f"WITH RECURSIVE s(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM s "
            f"WHERE i < {hi}) ", "s")


def insert_entries(dialect: str, source: str, conv: str, seq: str) -> str:
    """INSERT ... SELECT of entries whose text is picked from `bench_pool` by position."""
    g = f"({conv} * 1000003 + {seq})"  # the entry's number in the whole store
    p = [f"(SELECT text FROM bench_pool WHERE id = ({g} * {m}) % {q})"
         for m, q in zip(MULTS, PRIMES, strict=True)]
    user = f"{p[0]} || CASE WHEN {g} % 3 = 0 THEN ' ' || {p[1]} ELSE '' END"
    assistant = " || ' ' || ".join(p)
    tail = f"CASE WHEN {g} % 7 = 0 THEN ' Ticket ' || (({g} * 7919) % 1000003) || '.' ELSE '' END"
    return (f"INSERT INTO entries (conversation_id, seq, kind, author, text, created_at) "
            f"SELECT {conv}, {seq}, CASE {seq} % 2 WHEN 1 THEN 'user' ELSE 'assistant' END, "
            f"CASE {seq} % 2 WHEN 1 THEN 'ana' END, "
            f"(CASE {seq} % 2 WHEN 1 THEN {user} ELSE {assistant} END) || {tail}, "
            f"CAST(:t0 AS double precision) + {seq} * CAST(:step AS double precision) "
            f"FROM {source}")


async def build_idle(store: Store, pool: list[str], n: int) -> dict:
    """The paragraph pool, then `n` idle conversations of 3 entries each."""
    d, t = store.dialect, time.time()
    start = time.perf_counter()
    with_, rows = series(d, "1", "CAST(:n AS bigint)")
    k_with, k_rows = series(d, "1", "3")
    async with store.engines.write.begin() as conn:
        await conn.execute(text("CREATE TABLE bench_pool (id INTEGER PRIMARY KEY, text TEXT)"))
        await conn.execute(text("INSERT INTO bench_pool (id, text) VALUES (:id, :text)"),
                           [{"id": i, "text": t} for i, t in enumerate(pool)])
        await conn.execute(text(
            f"{with_}INSERT INTO conversations (key, owner, last_seq, meta, scope, created_at, "
            f"updated_at) SELECT 'idle:' || i, 'person' || (i % 500), 3, '{{}}', CASE WHEN "
            f"i % 4 = 0 THEN 'channel:C' || (i % 200) ELSE 'private:person' || (i % 500) END, "
            f"CAST(:t AS double precision), CAST(:t AS double precision) FROM {rows}"),
            {"n": n, "t": t})
        await conn.execute(text(k_with + insert_entries(
            d, f"conversations AS c, {k_rows} WHERE c.key LIKE 'idle:%'", "c.id", "s.i")),
            {"t0": t - 400 * 86400, "step": 60.0})
    return {f"build {n:,} idle conversations x3 entries (s)": time.perf_counter() - start}


async def build_conversation(store: Store, n: int, biggest: int) -> tuple[int, dict]:
    conv = await store.ensure_conversation(f"bench:{n}", owner="ana",
                                           scope=f"channel:bench-{n}")
    step = YEARS * 365 * 86400 / biggest
    with_, rows = series(store.dialect, "CAST(:lo AS bigint)", "CAST(:hi AS bigint)")
    sql = text(with_ + insert_entries(store.dialect, rows, "CAST(:c AS bigint)", "s.i"))
    start = time.perf_counter()
    for lo in range(1, n + 1, BATCH):
        async with store.engines.write.begin() as conn:
            await conn.execute(sql, {"lo": lo, "hi": min(lo + BATCH - 1, n), "c": conv.id,
                                     "t0": time.time() - n * step, "step": step})
        if n > BATCH:
            note(f"    {min(lo + BATCH - 1, n):,}/{n:,} "
                 f"({time.perf_counter() - start:.0f}s)")
    async with store.engines.write.begin() as conn:
        await conn.execute(text("UPDATE conversations SET last_seq = :n WHERE id = :c"),
                           {"n": n, "c": conv.id})
        if store.dialect == "postgresql":
            await conn.execute(text("ANALYZE entries, conversations"))
    wall = time.perf_counter() - start
    return conv.id, {f"build n={n:,} entries/s (indexed)": n / wall}


def make_queries(rng: random.Random, words: list[str], pool: list[str], conv_id: int,
                 n: int) -> list[str]:
    bare = [p.lower().replace(".", "").replace("?", "").split() for p in pool]
    spread = Counter(w for p in bare for w in set(p))
    rare = sorted(w for w, c in spread.items() if c == 1)
    numbers = (conv_id * 1000003 + seq for seq in range(1, n + 1, max(n // 200, 1)))
    tickets = [str(g * 7919 % 1000003) for g in numbers if g % 7 == 0]  # as in the SQL
    phrases = []
    for p in rng.sample(bare, 10):
        k = rng.randint(2, min(3, len(p)))
        at = rng.randrange(len(p) - k + 1)
        phrases.append('"' + " ".join(p[at:at + k]) + '"')
    return (rng.sample(rare, 10) + tickets[:5] + COMMON[:12]
            + [f"{rng.choice(words[:60])} {rng.choice(words[60:600])}" for _ in range(10)]
            + phrases + list(NO_MATCH))


async def bench_search(store: Store, queries: list[str], n: int) -> dict:
    out = {}
    for where, scopes in (("all", None), ("scope", [f"channel:bench-{n}"]),
                          ("small scope", [SMALL_SCOPE])):
        latencies, found = [], 0
        for round_ in range(SEARCH_ROUNDS):
            for q in queries:
                start = time.perf_counter()
                hits = await store.search(q, scopes=scopes, limit=10)
                latencies.append(time.perf_counter() - start)
                found += round_ == 0 and bool(hits)
        out[f"search n={n:,} {where} p50/p99 (ms)"] = p50_p99(latencies)
        out[f"search n={n:,} {where} queries with hits"] = f"{found}/{len(queries)}"
    return out


async def probe(url: str, conv_id: int) -> dict:
    """In a fresh process: assemble the context of one conversation, timed and measured."""
    config = build_config({"llm": {"context_window": 128_000, "max_output_tokens": 4096}},
                          home=Path(__file__).parent)
    tools = (await build_toolbox(config)).specs()
    async with fresh_store(url) as store:
        gc.collect()
        before = await asyncio.to_thread(_proc_status, True)
        start = time.perf_counter()
        assembled = await build_request(store, config, conv_id, tools=tools, model="m")
        cold = time.perf_counter() - start
        after = await asyncio.to_thread(_proc_status)
        cache, warm = ContextCache(), []
        await build_request(store, config, conv_id, tools=tools, model="m", cache=cache)
        for _ in range(WARM_RUNS):
            start = time.perf_counter()
            await build_request(store, config, conv_id, tools=tools, model="m", cache=cache)
            warm.append(time.perf_counter() - start)
    window = {"window entries": len(assembled.window.entries),
              "window chars": assembled.window.chars}
    del assembled, cache
    async with fresh_store(url) as store:
        gc.collect()
        tracemalloc.start()
        await build_request(store, config, conv_id, tools=tools, model="m")
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return {"cold (ms)": cold * 1000, "warm median (ms)": statistics.median(warm) * 1000,
            "RSS growth (MB)": after["VmHWM"] - before["VmRSS"], "tracemalloc peak (MB)": peak,
            **window}


async def bench_context(url: str, conv_ids: dict[int, int]) -> dict:
    """`probe` in PROBES fresh processes per size, interleaved so that other load on the
    machine hits every size alike; medians, and the largest size over the smallest."""
    runs: dict[int, list[dict]] = {n: [] for n in conv_ids}
    for i in range(PROBES):
        note(f"  context, fresh processes {i + 1}/{PROBES}")
        for n, conv_id in conv_ids.items():
            proc = await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--probe", url, str(conv_id),
                stdout=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            if proc.returncode:
                raise RuntimeError(f"context probe for n={n:,} failed")
            runs[n].append(json.loads(out))
    medians = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
               for n, rs in runs.items()}
    out = {f"context n={n:,} {k}": v for n, m in medians.items() for k, v in m.items()}
    small, big = min(conv_ids), max(conv_ids)
    for metric in ("cold (ms)", "warm median (ms)", "RSS growth (MB)", "tracemalloc peak (MB)"):
        if small != big:
            a, b = medians[small][metric], medians[big][metric]
            out[f"context n={big:,} / n={small:,} {metric.split(' (')[0]} ratio"] = (
                b / a if a > 0 else float("inf"))
    return out


def write_jsonl(path: Path, lines: int, pool: list[str], rng: random.Random) -> None:
    t0 = time.time() - lines * 60
    with open(path, "w") as f:
        for i in range(lines):
            role = "user" if i % 2 == 0 else "assistant"
            body = " ".join(rng.choices(pool, k=1 if role == "user" else rng.randint(2, 5)))
            ts = datetime.fromtimestamp(t0 + i * 60, UTC).isoformat()
            f.write(json.dumps({"session": f"import:{i % 100}", "role": role,
                                "author": "ana" if role == "user" else "steward",
                                "text": body, "ts": ts, "ref": f"msg-{i}"}) + "\n")


async def bench_import(backend, path: Path, lines: int) -> dict:
    async with backend() as url:
        store = await open_store(url)
        try:
            note(f"  import {lines:,} JSONL lines")
            first = await import_file(store, path, "jsonl")
            note("  import the same file again")
            again = await import_file(store, path, "jsonl")
        finally:
            await store.close()
    if first.added != lines or first.malformed or again.added or again.duplicates != lines:
        raise RuntimeError(f"import: {first.summary()} / again: {again.summary()}")
    return {"import entries/s": first.added / first.seconds, "import total (s)": first.seconds,
            "re-import new entries": again.added, "re-import no-op pass (s)": again.seconds,
            "re-import lines/s": lines / again.seconds}


async def run_backend(backend, sizes: list[int], idle: int, jsonl: Path, lines: int) -> dict:
    rng = random.Random(7)
    words = vocabulary(rng)
    pool = paragraphs(rng, words)
    results: dict = {}
    async with backend() as url:
        store = await open_store(url)
        conv_ids = {}
        try:
            note(f"  {idle:,} idle conversations")
            results.update(await build_idle(store, pool, idle))
            for n in sizes:
                note(f"  build n={n:,}")
                conv_ids[n], built = await build_conversation(store, n, max(sizes))
                results.update(built)
                note(f"  search n={n:,}")
                queries = make_queries(rng, words, pool, conv_ids[n], n)
                results.update(await bench_search(store, queries, n))
        finally:
            await store.close()
        results.update(await bench_context(url, conv_ids))
    results.update(await bench_import(backend, jsonl, lines))
    return results


def show(metric: str, value) -> str:
    if isinstance(value, str):
        return value
    shown = fmt(value)
    if metric.endswith(" ratio"):
        shown += f"  ({'FAIL' if value > LIMIT else 'ok'}: limit {LIMIT}x)"
    return shown


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--import-lines", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--probe", nargs=2, help=argparse.SUPPRESS)  # URL CONVERSATION_ID
    args = parser.parse_args()
    if args.probe:
        print(json.dumps(await probe(args.probe[0], int(args.probe[1]))))
        return 0
    sizes = sorted(int(s) for s in args.sizes.split(","))
    backends = {"sqlite": sqlite_url, "postgres": postgres_url}
    chosen = list(backends) if args.backend == "both" else [args.backend]
    figures = {}
    # Setup, blocking on purpose: a temporary directory for the JSONL file.
    with tempfile.TemporaryDirectory(prefix="steward-bench-jsonl-") as tmp:
        jsonl = Path(tmp) / "history.jsonl"
        rng = random.Random(11)
        await asyncio.to_thread(write_jsonl, jsonl, args.import_lines,
                                paragraphs(rng, vocabulary(rng)), rng)
        for name in chosen:
            note(f"{name}:")
            figures[name] = await run_backend(backends[name], sizes, args.idle, jsonl,
                                              args.import_lines)
    failed = [f"{name}: {m}" for name, f in figures.items() for m, v in f.items()
              if m.endswith(" ratio") and v > LIMIT]
    if args.json:
        print(json.dumps({"sizes": sizes, "idle": args.idle, "import_lines": args.import_lines,
                          **figures, "failed": failed}, indent=2))
    else:
        width = max(len(m) for f in figures.values() for m in f) + 2
        print(f"{'backend':<10}{'metric':<{width}}value")
        for name, metrics in figures.items():
            for metric, value in metrics.items():
                print(f"{name:<10}{metric:<{width}}{show(metric, value)}")
        print("FAIL: " + "; ".join(failed) if failed else f"ok: every ratio within {LIMIT}x")
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main()))
