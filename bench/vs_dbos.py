"""Steward's safe sandwich against DBOS's one-step workflow, SQLite and PostgreSQL, one run.

1. DBOS (a dev-only bench dependency: `pip install -e '.[bench]'`): a workflow that calls
   one `@DBOS.step` doing nothing, through DBOS's async API (`DBOS.start_workflow_async`,
   then `await handle.get_result()`; DBOS runs its own database calls in threads under
   it). Its system database is a SQLite file, or a fresh PostgreSQL database
   (dbos_bench_<random>, dropped at the end). p50 from the start of the workflow to its
   result, one at a time; workflows/s with 64 started and awaited at once.
   On SQLite, two DBOS rows: as shipped (DBOS leaves the file in SQLite's default
   rollback journal), and with the file put in WAL beforehand, as Steward runs its store
   (both at SQLite's default synchronous=FULL).
2. Steward: the safe sandwich (claim + result, two commits) through the real `Runner`,
   exactly as bench/store.py measures it: p50 from the claim to the result's commit at
   c=1, and steps/s at c=64 over tasks queued beforehand.
   Each system gets a c=64 run long enough to be timed (--burst for Steward, as
   bench/store.py's; --dbos-burst, fewer, for DBOS), and the same --steps at c=1.
3. The floor, for scale: two raw commits, as bench/store.py's.

The machine is shared, so rounds alternate (DBOS, Steward, Steward, DBOS, ...) and each
figure is the median over the rounds (every round is in --json). DBOS is launched afresh
for each of its rounds and destroyed after, so its background threads never run during
Steward's.

usage: .venv/bin/python bench/vs_dbos.py [--backend sqlite|postgres|both] [--rounds 3]
           [--steps 300] [--burst 6000] [--dbos-burst 1000] [--json]
"""

import argparse
import asyncio
import json
import logging
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from importlib.metadata import version
from pathlib import Path

import asyncpg
from sqlalchemy import make_url

# Run as a script, this file's directory comes first on sys.path and its sibling store.py
# shadows the `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

try:
    from dbos import DBOS
except ImportError:  # a bench-only dependency
    sys.exit("bench/vs_dbos.py needs DBOS: .venv/bin/pip install -e '.[bench]'")

from bench.store import (  # noqa: E402
    KIND_SAFE,
    PG_URL,
    TimedStore,
    bench_sandwich,
    floor,
    note,
    p50_p99,
    postgres_url,
    sqlite_url,
)
from store.engine import create_engines, migrate  # noqa: E402

CONCURRENCY = 64
WARMUP = 20
FLOOR_RUNS = 300


@DBOS.step()
async def noop_step(i: int) -> dict:
    return {"ok": True, "i": i}


@DBOS.workflow()
async def one_step(i: int) -> dict:
    return await noop_step(i)


# -- DBOS ----------------------------------------------------------------------------------


@asynccontextmanager
async def dbos_launched(system_database_url: str):
    """DBOS launched on that system database, destroyed on the way out."""
    DBOS(config={"name": "vs-dbos", "system_database_url": system_database_url,
                 "log_level": "WARNING"})
    try:
        await asyncio.to_thread(DBOS.launch)
        yield
    finally:
        await asyncio.to_thread(DBOS.destroy)
        # DBOS made its (now shut down) executor this loop's default: give asyncio one
        # that works again for what follows.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())


async def _one(i: int) -> float:
    start = time.perf_counter()
    handle = await DBOS.start_workflow_async(one_step, i)
    result = await handle.get_result()
    if result["i"] != i:
        raise RuntimeError(f"DBOS workflow {i} returned {result}")
    return time.perf_counter() - start


async def bench_dbos(system_database_url: str, n1: int, n64: int) -> dict:
    async with dbos_launched(system_database_url):
        # Warm up, the pool too: every round starts a new DBOS.
        for i in range(WARMUP):
            await _one(i)
        await asyncio.gather(*(_one(i) for i in range(CONCURRENCY)))
        seconds = [await _one(i) for i in range(n1)]
        todo = iter(range(n64))

        async def worker():
            for i in todo:
                await _one(i)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        wall = time.perf_counter() - t0
    return {"p50 c=1 (ms)": p50_p99(seconds)[0], "steps/s c=64": n64 / wall}


@asynccontextmanager
async def dbos_urls(backend: str):
    """The system databases DBOS is run on, as {label: url}; removed on the way out."""
    if backend == "sqlite":
        # Setup and teardown, blocking on purpose: a temporary directory for the files.
        with tempfile.TemporaryDirectory(prefix="steward-vs-dbos-") as tmp:
            wal = f"{tmp}/dbos-wal.sqlite"
            db = sqlite3.connect(wal)  # WAL is a property of the file: it stays
            db.execute("PRAGMA journal_mode=WAL")
            db.close()
            yield {"dbos": f"sqlite:///{tmp}/dbos.sqlite", "dbos (WAL)": f"sqlite:///{wal}"}
        return
    name = f"dbos_bench_{uuid.uuid4().hex[:12]}"
    await _pg_admin_autocommit(f'CREATE DATABASE "{name}"')
    try:
        url = make_url(PG_URL).set(drivername="postgresql", database=name)
        yield {"dbos": url.render_as_string(hide_password=False)}
    finally:
        await _pg_admin_autocommit(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _pg_admin_autocommit(sql: str) -> None:
    """CREATE/DROP DATABASE cannot run in a transaction block."""
    u = make_url(PG_URL)
    conn = await asyncpg.connect(host=u.host, port=u.port, user=u.username,
                                 database=u.database)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# -- Steward -------------------------------------------------------------------------------


async def bench_steward(store: TimedStore, n1: int, n64: int) -> dict:
    one = await bench_sandwich(store, KIND_SAFE, n1, 1)
    many = await bench_sandwich(store, KIND_SAFE, n64, CONCURRENCY)
    return {"p50 c=1 (ms)": one["safe sandwich c=1 claim->result p50/p99 (ms)"][0],
            "steps/s c=64": many[f"safe sandwich c={CONCURRENCY} steps/s"]}


# -- the run -------------------------------------------------------------------------------


async def run_backend(backend: str, rounds: int, n1: int, n64: int, dbos64: int) -> dict:
    steward_url = {"sqlite": sqlite_url, "postgres": postgres_url}[backend]
    async with steward_url() as url, dbos_urls(backend) as dbos:
        store = TimedStore(create_engines(url))
        try:
            await migrate(store.engines)
            await bench_sandwich(store, KIND_SAFE, WARMUP, 1)  # warm up, the pools too
            await bench_sandwich(store, KIND_SAFE, 2 * CONCURRENCY, CONCURRENCY)
            runs: dict[str, list[dict]] = {label: [] for label in (*dbos, "steward")}
            for r in range(rounds):
                order = [*dbos, "steward"]
                if r % 2:
                    order.reverse()
                for label in order:
                    note(f"  round {r + 1}/{rounds}: {label}")
                    runs[label].append(await bench_steward(store, n1, n64)
                                       if label == "steward"
                                       else await bench_dbos(dbos[label], n1, dbos64))
            floor2 = (await floor(url, (2,), runs=FLOOR_RUNS))[2]
        finally:
            await store.close()
    out = {}
    for label, got in runs.items():
        out[label] = {metric: statistics.median(r[metric] for r in got) for metric in got[0]}
        out[label]["rounds"] = got
    steward = out["steward"]
    for label in dbos:
        out[label]["Steward/DBOS steps/s"] = steward["steps/s c=64"] / out[label]["steps/s c=64"]
        out[label]["DBOS/Steward p50"] = out[label]["p50 c=1 (ms)"] / steward["p50 c=1 (ms)"]
    out["floor: 2 raw commits"] = {"p50 c=1 (ms)": floor2}
    return out


def _cell(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="c=1 runs per round and system")
    parser.add_argument("--burst", type=int, default=6000,
                        help=f"Steward's c={CONCURRENCY} sandwiches per round")
    parser.add_argument("--dbos-burst", type=int, default=1000,
                        help=f"DBOS's c={CONCURRENCY} workflows per round and variant")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chosen = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    figures = {}
    t0 = time.perf_counter()
    for backend in chosen:
        note(f"{backend}:")
        figures[backend] = await run_backend(backend, args.rounds, args.steps, args.burst,
                                             args.dbos_burst)
    meta = {"dbos": version("dbos"), "dbos api": "async (start_workflow_async, get_result)",
            "rounds": args.rounds, "steps": args.steps, "burst": args.burst,
            "dbos burst": args.dbos_burst,
            "concurrency": CONCURRENCY, "figure": "median over rounds",
            "seconds": round(time.perf_counter() - t0, 1)}
    if args.json:
        print(json.dumps({**meta, **figures}, indent=2))
        return
    print(f"DBOS {meta['dbos']}, async API; median of {args.rounds} interleaved rounds; "
          f"per round: {args.steps} at c=1, {args.burst} (Steward) / {args.dbos_burst} "
          f"(DBOS) at c={CONCURRENCY}")
    head = (f"{'system':<22}{'backend':<10}{'p50 c=1 (ms)':>14}{'steps/s c=64':>14}"
            f"{'Steward/DBOS steps/s':>22}{'DBOS/Steward p50':>18}")
    print(head)
    for backend, systems in figures.items():
        for label, f in systems.items():
            print(f"{label:<22}{backend:<10}{_cell(f.get('p50 c=1 (ms)'), '.3f'):>14}"
                  f"{_cell(f.get('steps/s c=64'), ',.0f'):>14}"
                  f"{_cell(f.get('Steward/DBOS steps/s'), '.1f'):>22}"
                  f"{_cell(f.get('DBOS/Steward p50'), '.1f'):>18}")
    print(f"({meta['seconds']:.0f}s)")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
