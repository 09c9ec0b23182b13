"""Store benchmark, SQLite and PostgreSQL in one run:

1. a bare INSERT + commit on the store's write engine (the floor for any step);
2. effect sandwiches (intent -> effect -> result) through the real `Runner`;
3. reading the last page of a conversation of 10^3 and 10^6 entries, in a fresh handle:
   time and memory, so a read that grows with the conversation shows.

usage: .venv/bin/python bench/store.py [--backend sqlite|postgres|both]
           [--sizes 1000,1000000] [--steps 2000] [--json]
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
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, Text, insert, text, update
from sqlalchemy.ext.asyncio import create_async_engine

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bot.runtime import Effect, Policy, Registry, Runner, RunnerOptions  # noqa: E402
from store import DONE, TERMINAL, Store, Writes, open_store  # noqa: E402
from store.engine import create_engines, migrate  # noqa: E402
from store.schema import conversations, entries  # noqa: E402

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
KIND = "bench.noop"
BATCH = 10_000
PAGE_RUNS = 20
WORDS = ("the meeting moved to thursday please send notes on invoice draft and review agenda "
         "follow up with budget for next quarter client project deadline summary").split()


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def p50_p99(seconds: list[float]) -> list[float]:
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    return [q[49] * 1000, q[98] * 1000]


class Noop(Effect):
    """A safe effect with no I/O; notes when each task's intent phase starts."""

    kind = KIND
    policy = Policy.SAFE

    def __init__(self, started: dict[str, float]):
        self.started = started

    async def step(self, ctx):
        if ctx.phase == "":
            self.started[ctx.task.id] = time.perf_counter()
        return await super().step(ctx)

    async def perform(self, ctx):
        return {"ok": True, "i": ctx.inputs["i"]}


class TimedStore(Store):
    """The real store, noting when each task's terminal commit returns and counting the
    runner's `next_due` polls."""

    def __init__(self, engines):
        super().__init__(engines)
        self.finished: dict[str, float] = {}
        self.polls = 0

    async def commit(self, writes):
        result = await super().commit(writes)
        update_ = writes.task_update
        if update_ is not None and update_.state in TERMINAL:
            self.finished[update_.task_id] = time.perf_counter()
        return result

    async def next_due(self):
        self.polls += 1
        return await super().next_due()


async def bench_bare(store: Store, n: int) -> dict:
    table = Table("bench_bare", MetaData(), Column("id", Integer, primary_key=True),
                  Column("payload", Text))
    engine = store._engines.write
    async with engine.begin() as conn:
        await conn.run_sync(table.metadata.create_all)
    latencies = []
    t0 = time.perf_counter()
    for i in range(n):
        start = time.perf_counter()
        async with engine.begin() as conn:
            await conn.execute(insert(table).values(payload=f"row {i}"))
        latencies.append(time.perf_counter() - start)
    wall = time.perf_counter() - t0
    return {"bare insert+commit p50/p99 (ms)": p50_p99(latencies), "bare commits/s": n / wall}


async def bench_sandwich(store: TimedStore, n: int, concurrency: int) -> dict:
    started: dict[str, float] = {}
    writes = Writes()
    ids = [writes.spawn(KIND, {"i": i}) for i in range(n)]
    await store.commit(writes)
    runner = Runner(store, Registry(Noop(started)),
                    RunnerOptions(concurrency=concurrency, poll_seconds=0.01))
    await runner.recover(steal_all=True)
    store.polls = 0
    t0 = time.perf_counter()
    await runner.run(until_idle=True)
    wall = time.perf_counter() - t0
    counts = await store.count_tasks()
    if set(counts) != {DONE} or not all(i in store.finished for i in ids):
        raise RuntimeError(f"sandwich run left tasks unfinished: {counts}")
    label = f"sandwich c={concurrency}"
    out = {f"{label} steps/s": n / wall, f"{label} next_due polls/step": store.polls / n}
    if concurrency == 1:
        out[f"{label} intent->result p50/p99 (ms)"] = p50_p99(
            [store.finished[i] - started[i] for i in ids])
    return out


async def build_conversation(store: Store, n: int, rng: random.Random) -> int:
    """Setup: bulk-load `n` entries straight into the table, batch by batch."""
    conv = await store.ensure_conversation(f"bench:{n}:{uuid.uuid4().hex[:8]}")
    texts = [" ".join(rng.choices(WORDS, k=34))[:200] for _ in range(1000)]
    t, t0 = time.time(), time.perf_counter()
    for lo in range(1, n + 1, BATCH):
        rows = [dict(conversation_id=conv.id, seq=seq, kind="message",
                     author="user" if seq % 2 else "steward", text=texts[seq % len(texts)],
                     data=None, ref=None, task_id=None, created_at=t + seq * 1e-3)
                for seq in range(lo, min(lo + BATCH, n + 1))]
        async with store._engines.write.begin() as conn:
            await conn.execute(insert(entries), rows)
        if n > BATCH and (lo // BATCH + 1) % 10 == 0:
            note(f"  built {lo + len(rows) - 1:,}/{n:,} entries "
                 f"({time.perf_counter() - t0:.0f}s)")
    async with store._engines.write.begin() as conn:
        await conn.execute(update(conversations).where(conversations.c.id == conv.id)
                           .values(last_seq=n))
    return conv.id


def _proc_status(reset_peak: bool = False) -> dict[str, float]:
    if reset_peak:
        with open("/proc/self/clear_refs", "w") as f:  # "5": VmHWM restarts from VmRSS
            f.write("5")
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


@asynccontextmanager
async def fresh_store(url: str):
    """A new handle, nothing cached, already connected (reads are timed without connect)."""
    store = await open_store(url, upgrade=False)
    try:
        await store.list_conversations(limit=1)
        yield store
    finally:
        await store.close()


async def bench_page(url: str, conv_id: int, n: int) -> dict:
    """Time the last page in a fresh handle, then measure its memory in another one."""
    async with fresh_store(url) as store:
        start = time.perf_counter()
        page = await store.entries_page(conv_id, limit=50)
        cold = time.perf_counter() - start
        if len(page) != min(n, 50) or page[-1].seq != n:
            raise RuntimeError(f"wrong last page for n={n}")
        warm = []
        for _ in range(PAGE_RUNS):
            start = time.perf_counter()
            await store.entries_page(conv_id, limit=50)
            warm.append(time.perf_counter() - start)
    async with fresh_store(url) as store:
        gc.collect()
        before = await asyncio.to_thread(_proc_status, True)
        tracemalloc.start()
        await store.entries_page(conv_id, limit=50)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        after = await asyncio.to_thread(_proc_status)
    label = f"page n={n:,}"
    return {f"{label} cold / median (ms)": [cold * 1000, statistics.median(warm) * 1000],
            f"{label} tracemalloc peak (MB)": peak,
            f"{label} RSS before/after/peak (MB)": [before["VmRSS"], after["VmRSS"],
                                                     after["VmHWM"]]}


async def run_backend(url: str, sizes: list[int], steps: int) -> dict:
    results: dict = {}
    store = TimedStore(create_engines(url))
    try:
        await migrate(store._engines)
        note(f"  bare insert+commit x{steps}")
        results.update(await bench_bare(store, steps))
        for concurrency in (1, 8):
            note(f"  sandwich x{steps}, concurrency={concurrency}")
            results.update(await bench_sandwich(store, steps, concurrency))
        rng = random.Random(42)
        conv_ids = {n: await build_conversation(store, n, rng) for n in sizes}
    finally:
        await store.close()
    for n, conv_id in conv_ids.items():
        note(f"  last page of {n:,} entries")
        results.update(await bench_page(url, conv_id, n))
    if len(sizes) > 1:
        small, big = (f"page n={n:,}" for n in (min(sizes), max(sizes)))
        label = f"page n={max(sizes):,} / n={min(sizes):,}"
        results[f"{label} median time ratio"] = (results[f"{big} cold / median (ms)"][1]
                                                 / results[f"{small} cold / median (ms)"][1])
        results[f"{label} tracemalloc peak ratio"] = (results[f"{big} tracemalloc peak (MB)"]
                                                      / results[f"{small} tracemalloc peak (MB)"])
    return results


@asynccontextmanager
async def sqlite_url():
    # Setup and teardown, blocking on purpose: a temporary directory for the database file.
    with tempfile.TemporaryDirectory(prefix="steward-bench-") as tmp:
        yield f"sqlite+aiosqlite:///{tmp}/bench.db"


async def _pg_admin(sql: str) -> None:
    engine = create_async_engine(PG_URL)
    try:
        async with engine.begin() as conn:
            await conn.execute(text(sql))
    finally:
        await engine.dispose()


@asynccontextmanager
async def postgres_url():
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


def fmt(value) -> str:
    if isinstance(value, list):
        return " / ".join(fmt(v) for v in value)
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--sizes", default="1000,1000000")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    backends = {"sqlite": sqlite_url, "postgres": postgres_url}
    chosen = list(backends) if args.backend == "both" else [args.backend]
    figures = {}
    for name in chosen:
        note(f"{name}:")
        async with backends[name]() as url:
            figures[name] = await run_backend(url, sizes, args.steps)
    if args.json:
        print(json.dumps({"steps": args.steps, "sizes": sizes, **figures}, indent=2))
        return
    width = max(len(m) for f in figures.values() for m in f) + 2
    print(f"{'backend':<10}{'metric':<{width}}value")
    for name, metrics in figures.items():
        for metric, value in metrics.items():
            print(f"{name:<10}{metric:<{width}}{fmt(value)}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
