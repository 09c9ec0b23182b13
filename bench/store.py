"""Store benchmark, SQLite and PostgreSQL in one run:

1. the physical floor, measured in the same run: two (and three) raw commits of one small
   UPDATE each, straight through the driver (stdlib sqlite3 in WAL with synchronous=FULL,
   as the store runs it; asyncpg); on SQLite also the same commits sent one by one from
   an event loop to a thread of their own, the least an asyncio program pays for them;
   and the design floor: the store's own hot-path statements for the same sandwiches, on
   the driver alone (on SQLite from asyncio, one hop per transaction), so that Steward's
   ratio to it is what its runner and store add;
2. whole effect sandwiches through the real `Runner`, timed from the claim to the result's
   commit: safe (claim + result: two commits) and unsafe (claim, intent, result: three;
   the intent rides on the claim where it can), p50/p99 at c=1 with the ratio to the
   floor; and a queue worked through at c=1, where each result commit also claims the
   next task: wall time per step and its ratio to the same floor; steps/s at c=64. A claim
   that rides on a result commit is timed from the start of that commit. `--warmup` steps
   of each kind run first, untimed: a fresh database file grows its WAL on every commit at
   first (`--warmup 0` shows the difference), and a store that runs for years is past that;
3. a claim's p50 with 20 / 2,000 / 20,000 ready tasks (it should not grow with the queue);
4. reading the last page of a conversation of 10^3 and 10^6 entries, in a fresh handle:
   time and memory, so a read that grows with the conversation shows.

usage: .venv/bin/python bench/store.py [--backend sqlite|postgres|both]
           [--sizes 1000,1000000] [--steps 2000] [--burst 6000] [--depths 20,2000,20000]
           [--warmup 500] [--json]
"""

import argparse
import asyncio
import gc
import json
import logging
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from sqlalchemy import insert, make_url, text, update
from sqlalchemy.ext.asyncio import create_async_engine

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bot.runtime import Effect, Policy, Registry, Runner, RunnerOptions  # noqa: E402
from store import DONE, RUNNING, TERMINAL, Store, Writes, new_id, open_store  # noqa: E402
from store.engine import _writer_connection, create_engines, migrate  # noqa: E402
from store.hotpath import (  # noqa: E402
    UPDATE_KNOWN_PARENT,
    pg_claim,
    pg_update,
    pg_update_then_claim,
    sqlite_claim,
    update_params,
)
from store.records import now  # noqa: E402
from store.schema import conversations, entries, tasks  # noqa: E402
from store.writer import SqliteWriter  # noqa: E402
from store.writes import Claim, TaskUpdate  # noqa: E402

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
KIND_SAFE, KIND_UNSAFE, KIND_IDLE = "bench.safe", "bench.unsafe", "bench.queued"
BATCH = 10_000
PAGE_RUNS = 20
CLAIM_RUNS = 300
FLOOR_RUNS = 1000
WORDS = ("the meeting moved to thursday please send notes on invoice draft and review agenda "
         "follow up with budget for next quarter client project deadline summary").split()


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def p50_p99(seconds: list[float]) -> list[float]:
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    return [q[49] * 1000, q[98] * 1000]


class SafeNoop(Effect):
    """A safe effect with no I/O: claim, then its result (two commits)."""

    kind = KIND_SAFE
    policy = Policy.SAFE

    async def perform(self, ctx):
        return {"ok": True, "i": ctx.inputs["i"]}


class UnsafeNoop(SafeNoop):
    """The same with an intent commit before the effect (three commits)."""

    kind = KIND_UNSAFE
    policy = Policy.UNSAFE


class TimedStore(Store):
    """The real store, noting when the claim that took each task began and when the task's
    terminal commit returned."""

    def __init__(self, engines):
        super().__init__(engines)
        self.claimed: dict[str, float] = {}
        self.finished: dict[str, float] = {}

    async def claim(self, c):
        start = time.perf_counter()
        claimed = await super().claim(c)
        for task in claimed:
            self.claimed.setdefault(task.id, start)
        return claimed

    async def commit(self, writes, *, then_claim=None):
        start = time.perf_counter()  # of the claim that rides on it, if any
        result = await super().commit(writes, then_claim=then_claim)
        for task in result.claimed:
            self.claimed.setdefault(task.id, start)
        update_ = writes.task_update
        if update_ is not None and update_.state in TERMINAL:
            self.finished[update_.task_id] = time.perf_counter()
        return result


# -- the floor: the same commits with nothing but the driver ------------------------------


def _floor_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=FULL"):
        db.execute(f"PRAGMA {pragma}")
    db.execute("CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, v INTEGER)")
    db.execute("INSERT OR IGNORE INTO floor VALUES (1, 0)")
    return db


def _interleaved(one, runs: int, counts: tuple[int, ...]) -> dict[int, list[float]]:
    """`runs` times each of `counts` calls of `one()` in turn, timed: the runs of each count
    interleave, so a disk that slows for a while slows every count alike."""
    out: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(runs):
        for n in counts:
            start = time.perf_counter()
            for _ in range(n):
                one()
            out[n].append(time.perf_counter() - start)
    return out


async def _interleaved_async(one, runs: int,
                             counts: tuple[int, ...]) -> dict[int, list[float]]:
    """`_interleaved` for a coroutine function."""
    out: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(runs):
        for n in counts:
            start = time.perf_counter()
            for _ in range(n):
                await one()
            out[n].append(time.perf_counter() - start)
    return out


def _sqlite_floor(path: str, runs: int, counts: tuple[int, ...]) -> dict[int, list[float]]:
    """Blocking, in a thread of its own: transactions of one UPDATE each."""
    db = _floor_db(path)

    def one():
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE floor SET v = v + 1 WHERE id = 1")
        db.execute("COMMIT")

    try:
        return _interleaved(one, runs, counts)
    finally:
        db.close()


async def _pg_floor(url: str, runs: int, counts: tuple[int, ...]) -> dict[int, list[float]]:
    """Autocommitted UPDATEs: one round trip and one WAL flush each."""
    u = make_url(url)
    schema = u.query.get("schema")
    conn = await asyncpg.connect(host=u.host, port=u.port, user=u.username,
                                 database=u.database,
                                 server_settings={"search_path": schema} if schema else None)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS floor (id int PRIMARY KEY, v int)")
        await conn.execute("INSERT INTO floor VALUES (1, 0) ON CONFLICT DO NOTHING")
        return await _interleaved_async(
            lambda: conn.execute("UPDATE floor SET v = v + 1 WHERE id = 1"), runs, counts)
    finally:
        await conn.close()


async def _sqlite_floor_from_asyncio(path: str, runs: int,
                                     counts: tuple[int, ...]) -> dict[int, list[float]]:
    """The same commits as `_sqlite_floor`, each sent from the event loop to a thread that
    owns the connection and awaited there: the least an asyncio program pays per commit
    to keep SQLite's fsync off its loop (one thread hop there and one back), here through
    the store's own writer thread (store/writer.py), each commit a transaction of its own."""
    writer = SqliteWriter(lambda: _floor_db(path))

    def one(s):
        s.raw.execute("UPDATE floor SET v = v + 1 WHERE id = 1")

    try:
        return await _interleaved_async(lambda: writer.run(one), runs, counts)
    finally:
        await writer.close()


# The design floor: the prototype as an asyncio program runs it. The store's own
# hot-path statements (store/hotpath.py) for a queue worked at c=1, straight on the driver,
# with no runner, store or step plan around them: each result also claims the next task
# (one transaction on SQLite, one statement on PostgreSQL), and an unsafe task's intent is
# a transaction between. What the runner and the store add is Steward's ratio to it.

DESIGN = Claim("bench:design", 1, 30.0, claim_id="design")


def _design_tasks(n: int) -> list[dict]:
    t = time.time()
    return [dict(id=new_id(), kind="bench.design", state="pending", phase="", inputs="{}",
                 attempts=0, crashes=0, run_after=0.0, created_at=t, updated_at=t)
            for _ in range(n)]


def _done(task_id: str) -> TaskUpdate:
    return TaskUpdate(task_id, DESIGN.owner, DONE, "", result={"ok": True})


def _intent(task_id: str) -> TaskUpdate:
    return TaskUpdate(task_id, DESIGN.owner, RUNNING, "effect", checkpoint={"intent": 1})


async def _design_run(claim, intent, finish, unsafe: bool, warmup: int) -> list[float]:
    """Work the queue through: `claim()` the first task, then for each its `intent(id)`
    (unsafe) and `finish(id)`, which claims the next. Each task's claim -> result time,
    timed as the sandwich is (from the start of the transaction that claimed it), after
    `warmup` untimed tasks (a fresh file's WAL grows at first)."""
    seconds, start = [], time.perf_counter()
    claimed = await claim()
    while claimed:
        task_id, began = claimed[0].id, start
        if unsafe:
            await intent(task_id)
        start = time.perf_counter()
        claimed = await finish(task_id)
        seconds.append(time.perf_counter() - began)
    return seconds[warmup:]


async def _sqlite_design_floor(path: str, steps: int, unsafe: bool,
                               warmup: int) -> list[float]:
    """On a new file at the store's schema, one hop per transaction (the store's writer
    thread, with nothing but these statements in its transactions)."""
    engines = create_engines(f"sqlite+aiosqlite:///{path}")
    try:
        await migrate(engines)
        async with engines.write.begin() as conn:
            await conn.execute(insert(tasks), _design_tasks(warmup + steps))
    finally:
        await engines.dispose()
    writer = SqliteWriter(lambda: _writer_connection(path))

    def update(s, u: TaskUpdate) -> None:
        if s.raw.execute(UPDATE_KNOWN_PARENT, update_params(u, now())).rowcount != 1:
            raise RuntimeError(f"design floor: task {u.task_id} not updated")

    def finish(task_id):
        def job(s):
            update(s, _done(task_id))
            return sqlite_claim(s.raw, DESIGN, now())
        return writer.run(job)

    try:
        return await _design_run(
            lambda: writer.run(lambda s: sqlite_claim(s.raw, DESIGN, now())),
            lambda task_id: writer.run(lambda s: update(s, _intent(task_id))), finish,
            unsafe, warmup)
    finally:
        await writer.close()


async def _pg_design_floor(store: Store, steps: int, unsafe: bool,
                           warmup: int) -> list[float]:
    """In the store's own schema, on one of its hot-path connections (its settings)."""
    async with store.engines.write.begin() as conn:
        await conn.execute(insert(tasks), _design_tasks(warmup + steps))
    async with (await store.engines.pool()).acquire() as conn:
        return await _design_run(
            lambda: pg_claim(conn, DESIGN, now()),
            lambda task_id: pg_update(conn, _intent(task_id), now()),
            lambda task_id: pg_update_then_claim(conn, _done(task_id), DESIGN, now()),
            unsafe, warmup)


async def floor(url: str, counts: tuple[int, ...] = (2, 3), runs: int = FLOOR_RUNS, *,
                from_asyncio: bool = False) -> dict[int, float]:
    """p50 in ms of each count of raw commits, the counts interleaved (SQLite
    `from_asyncio`: each commit a thread hop)."""
    if url.startswith("sqlite"):
        path = str(Path(make_url(url).database).with_name("floor.db"))
        if from_asyncio:
            seconds = await _sqlite_floor_from_asyncio(path, runs, counts)
        else:
            seconds = await asyncio.to_thread(_sqlite_floor, path, runs, counts)
    else:
        seconds = await _pg_floor(url, runs, counts)
    return {n: p50_p99(s)[0] for n, s in seconds.items()}


# -- the sandwich, claim to result ---------------------------------------------------------


async def bench_sandwich(store: TimedStore, kind: str, n: int, concurrency: int) -> dict:
    writes = Writes()
    ids = [writes.spawn(kind, {"i": i}) for i in range(n)]
    await store.commit(writes)
    # Statistics, as any store that has run a while has them (autovacuum's ANALYZE on
    # PostgreSQL): the plans timed are those a long-running store gets.
    async with store.engines.write.begin() as conn:
        await conn.execute(text("ANALYZE tasks"))
    runner = Runner(store, Registry(SafeNoop(), UnsafeNoop()),
                    RunnerOptions(concurrency=concurrency, poll_seconds=0.01))
    await runner.recover(steal_all=True)
    t0 = time.perf_counter()
    await runner.run(until_idle=True)
    wall = time.perf_counter() - t0
    counts = await store.count_tasks()
    if set(counts) != {DONE} or not all(i in store.finished for i in ids):
        raise RuntimeError(f"sandwich run left tasks unfinished: {counts}")
    label = f"{kind.split('.')[1]} sandwich c={concurrency}"
    out = {f"{label} steps/s": n / wall}
    if concurrency == 1:
        out[f"{label} wall per step (ms)"] = wall / n * 1000
        out[f"{label} claim->result p50/p99 (ms)"] = p50_p99(
            [store.finished[i] - store.claimed[i] for i in ids])
    return out


# -- a claim against a deep queue ----------------------------------------------------------


async def _queue_up(store: Store, n: int) -> None:
    """Setup: `n` more ready tasks, straight into the table."""
    t = time.time()
    for lo in range(0, n, BATCH):
        rows = [dict(id=new_id(), kind=KIND_IDLE, state="pending", phase="", inputs="{}",
                     attempts=0, crashes=0, run_after=0.0, created_at=t, updated_at=t)
                for _ in range(lo, min(lo + BATCH, n))]
        async with store.engines.write.begin() as conn:
            await conn.execute(insert(tasks), rows)
    async with store.engines.write.begin() as conn:
        await conn.execute(text("ANALYZE"))


async def bench_claims(store: Store, depths: list[int]) -> dict:
    """Claim one task and hand it back, `CLAIM_RUNS` times per depth; only the claim is
    timed."""
    out, queued = {}, 0
    owner = f"bench:{uuid.uuid4().hex[:8]}"
    for depth in sorted(depths):
        await _queue_up(store, depth - queued)
        queued = depth
        seconds = []
        for _ in range(CLAIM_RUNS):
            start = time.perf_counter()
            [task] = await store.claim_tasks(owner, 1, 30.0)
            seconds.append(time.perf_counter() - start)
            await store.release_tasks(owner, [task.id])
        out[f"claim with {depth:,} ready p50/p99 (ms)"] = p50_p99(seconds)
    lo, hi = (out[f"claim with {d:,} ready p50/p99 (ms)"][0] for d in (min(depths),
                                                                        max(depths)))
    out[f"claim p50 {max(depths):,} / {min(depths):,} ready"] = hi / lo
    async with store.engines.write.begin() as conn:  # out of the way of what follows
        await conn.execute(update(tasks).where(tasks.c.kind == KIND_IDLE).values(state=DONE))
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
        async with store.engines.write.begin() as conn:
            await conn.execute(insert(entries), rows)
        if n > BATCH and (lo // BATCH + 1) % 10 == 0:
            note(f"  built {lo + len(rows) - 1:,}/{n:,} entries "
                 f"({time.perf_counter() - t0:.0f}s)")
    async with store.engines.write.begin() as conn:
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


async def run_backend(url: str, sizes: list[int], steps: int, burst: int,
                      depths: list[int], warmup: int = 0) -> dict:
    results: dict = {}
    store = TimedStore(create_engines(url))
    try:
        await migrate(store.engines)
        if warmup:
            note(f"  warm-up: {warmup} of each kind, untimed")
            for kind in (KIND_SAFE, KIND_UNSAFE):
                await bench_sandwich(store, kind, warmup, 1)
            await floor(url, (2,), warmup)
        # Floors before and after the runs they are compared with, so both see the same
        # machine; the lower of the two is the floor.
        floors = {n: [p50] for n, p50 in (await floor(url)).items()}
        for kind in (KIND_SAFE, KIND_UNSAFE):
            note(f"  {kind} x{steps}, c=1")
            results.update(await bench_sandwich(store, kind, steps, 1))
        for n, p50 in (await floor(url)).items():
            floors[n].append(p50)
        two, three = min(floors[2]), min(floors[3])
        safe = results["safe sandwich c=1 claim->result p50/p99 (ms)"][0]
        unsafe = results["unsafe sandwich c=1 claim->result p50/p99 (ms)"][0]
        results["floor: 2 raw commits p50 (ms)"] = two
        results["floor: 3 raw commits p50 (ms)"] = three
        results["safe p50 / 2-commit floor"] = safe / two
        results["unsafe p50 / 3-commit floor"] = unsafe / three
        # A queue worked through one task at a time: the result commit claims the next.
        if url.startswith("sqlite"):
            hopping = await floor(url, from_asyncio=True)
            results["floor from asyncio: 2 commits, a thread hop each, p50 (ms)"] = hopping[2]
            results["floor from asyncio: 3 commits p50 (ms)"] = hopping[3]
            results["safe p50 / 2-commit floor from asyncio"] = safe / hopping[2]
            results["unsafe p50 / 3-commit floor from asyncio"] = unsafe / hopping[3]
        for label, commits, raw, ours in (("safe", 2, two, safe), ("unsafe", 3, three, unsafe)):
            if url.startswith("sqlite"):
                design = str(Path(make_url(url).database).with_name(f"design-{label}.db"))
                seconds = await _sqlite_design_floor(design, steps, label == "unsafe", warmup)
            else:
                seconds = await _pg_design_floor(store, steps, label == "unsafe", warmup)
            p50 = p50_p99(seconds)[0]
            results[f"design floor: {label}, {commits} transactions, p50 (ms)"] = p50
            results[f"design floor {label} / {commits}-commit floor"] = p50 / raw
            results[f"{label} p50 / design floor"] = ours / p50
        results["safe step / 2-commit floor"] = results[
            "safe sandwich c=1 wall per step (ms)"] / two
        results["unsafe step / 3-commit floor"] = results[
            "unsafe sandwich c=1 wall per step (ms)"] / three
        note(f"  {KIND_SAFE} x{burst}, c=64")
        results.update(await bench_sandwich(store, KIND_SAFE, burst, 64))
        note(f"  claims with {depths} ready")
        results.update(await bench_claims(store, depths))
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


def print_table(figures: dict[str, dict]) -> None:
    """Each backend's figures, one metric a line."""
    width = max(len(m) for f in figures.values() for m in f) + 2
    print(f"{'backend':<10}{'metric':<{width}}value")
    for name, metrics in figures.items():
        for metric, value in metrics.items():
            print(f"{name:<10}{metric:<{width}}{fmt(value)}")


def _ints(arg: str) -> list[int]:
    return [int(s) for s in arg.split(",") if s]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--sizes", default="1000,1000000", help="conversation sizes; '' skips")
    parser.add_argument("--steps", type=int, default=2000, help="sandwiches per c=1 run")
    parser.add_argument("--burst", type=int, default=6000, help="sandwiches in the c=64 run")
    parser.add_argument("--depths", default="20,2000,20000")
    parser.add_argument("--warmup", type=int, default=500,
                        help="untimed sandwiches of each kind first (0: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes, depths = _ints(args.sizes), _ints(args.depths)
    backends = {"sqlite": sqlite_url, "postgres": postgres_url}
    chosen = list(backends) if args.backend == "both" else [args.backend]
    figures = {}
    for name in chosen:
        note(f"{name}:")
        async with backends[name]() as url:
            figures[name] = await run_backend(url, sizes, args.steps, args.burst, depths,
                                              args.warmup)
    if args.json:
        print(json.dumps({"steps": args.steps, "sizes": sizes, **figures}, indent=2))
        return
    print_table(figures)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
