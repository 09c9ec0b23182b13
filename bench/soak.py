"""Soak benchmark: Steward must run for years without its process growing. Many turns go
through the real agent (the scripted zero-latency model of bench/agent.py, one tool round
per turn) across many conversations, and the process's memory is sampled at checkpoints.

Traffic: `--conversations` conversations (default 500); `--hot` of them (default 4) get
`--hot-share` of the turns (default 40%), the rest spread at random over the others, so
most conversations go idle and come back later (mostly after the context cache has
forgotten them), a few are very active. `--workers` turns are in flight at once (one
`steward ask`-like client each: subscribe to the conversation's events, submit, wait until
the turn has ended, unsubscribe).

At every 10% of the turns, with nothing in flight: VmRSS, SQLite's own memory
(sqlite3_memory_used: its page caches), tracemalloc's current size after gc.collect(), the
gc-tracked objects, done compactions, and the in-process structures keyed by conversation,
task or statement: the context cache (bot/agent/context.py: conversations, entries held,
their deep size), event subscriber queues (bot/agent/events.py), the runner's in-flight
tasks (bot/runtime/runner.py `_inflight`), the scripted model's kept requests (cleared
after every turn, as bench/agent.py does), this harness's own futures, SQLAlchemy's
compiled-statement caches, pooled connections and their prepared statements.

Warm-up and verdict: growth per 1000 turns from the end of the warm-up to the end. The
warm-up lasts until the bounded caches are full, and at least 30% of the turns. The
context cache (bot/agent/context.py) is bounded by count (64 conversations) and by bytes
(MAX_CACHE_BYTES, sized for the default 128k-token window); with the soak's small window
its byte bound is scaled down as the window is (`--context-cache-kib`, 768 KiB for 6,000
tokens), so that it fills within the warm-up as it does within days of real use: with the
full bound and 500 conversations it would fill after ~30,000 turns, and its filling would
read as growth. Every checkpoint prints what it holds against that bound, "(full)" once
it has had to drop a window to stay within its bytes, and where the warm-up ends (a run in which
it never fills says so and is measured from 30%). Its measured deep size is subtracted in
the tracemalloc verdict, and its bounds checked in both. So is linecache's (the source
lines a logged traceback reads, once per file: a one-time step when the first error is
logged).
FAIL (exit 1) if the rest of tracemalloc grows more than `--max-growth-kb` per 1000 turns
(default 1024: see THRESHOLD_WHY). The lines that grew most (tracemalloc snapshots at 30%
and at the end) are printed as evidence.

The context window is small (6,000 tokens, compaction scaled to it) so that the very
active conversations reach, within the warm-up, what years of use look like: a full window
and compaction summarising every dozen turns (its queries, statements and connections in
use). With the 128,000-token default that takes ~900 turns per conversation and the first
compaction would land after the warm-up (a one-time step that reads as growth).
tracemalloc makes a turn ~2.5x slower: the default 1200 turns take ~4-5 minutes per
backend on a loaded 2-core machine; `--turns 3000` about 2.5 times that.

`--rss-only`: no tracemalloc (it costs memory and time of its own), for the long soaks that
show whether RSS itself stays flat: 10,000 turns or more (`--checkpoints 10` prints every
1000). Every checkpoint prints the RSS growth per 1000 turns since the one before
(`RSS/1k`), so the curve is visible; FAIL if RSS grows more than `--max-rss-growth-mb`
per 1000 turns from the warm-up checkpoint to the end. The allocator is left as glibc sets
it up unless asked: `--arena-max N` (mallopt(M_ARENA_MAX), as bot/app/allocator.py does at
`steward run`) and `--trim-every S` (malloc_trim(0) in a thread every S seconds, its cost
printed); `--steward-allocator` is what `steward run` does (bot.app.allocator's defaults).
`--sqlite-cache-kib K` sets PRAGMA cache_size=-K on every SQLite connection and
`--sql-cache-size N` SQLAlchemy's compiled-statement cache (500 by default), to weigh
the caches outside tracemalloc's view.

Where the RSS is, per checkpoint, without tracemalloc: /proc/self/smaps (main heap, thread
arenas, other anonymous memory), glibc's mallinfo2 over all arenas (`malloc used`: bytes
handed out; `malloc free`: freed bytes the arenas keep), pymalloc's own bytes and arenas,
SQLite's memory and its peak since the checkpoint before, `peak MB` (VmHWM since the
checkpoint before), every SQLAlchemy engine's compiled statements (the SQLite writer's own
included: `all sql`). `--trimmed-floor` also reads the RSS again after one more
malloc_trim(0) (`trimmed MB`: live data and fragmentation, without the free pages that
the periodic trim would hand back; the verdict's RSS is read before it). Diagnosis only:
`--sql-peaks` ranks statements by SQLite's peak memory while they ran, `--no-recall`
assembles contexts without recall (the automatic memory search), `--dense-scopes` keeps
store/search.py from its sparse-scope plan on SQLite.

usage: .venv/bin/python bench/soak.py [--backend sqlite|postgres|both] [--turns 1200]
           [--conversations 500] [--hot 4] [--hot-share 0.4] [--workers 6]
           [--context-window 6000] [--max-growth-kb 1024] [--top 8] [--json]
           [--rss-only] [--checkpoints 10] [--max-rss-growth-mb 1.0] [--arena-max N]
           [--trim-every S] [--steward-allocator] [--sqlite-cache-kib K]
           [--sql-cache-size N] [--context-cache-kib K] [--trimmed-floor]
           [--sql-peaks] [--no-recall] [--dense-scopes]
"""

import argparse
import asyncio
import ctypes
import dataclasses
import gc
import json
import linecache
import logging
import os
import random
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path

from sqlalchemy import event, func, select
from sqlalchemy.util import LRUCache

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.agent import CountingStore, serving_agent  # noqa: E402
from bench.store import _proc_status, note, postgres_url, sqlite_url  # noqa: E402
from bot.agent.context import MAX_CACHE_BYTES  # noqa: E402
from bot.agent.deps import AgentDeps  # noqa: E402
from bot.agent.inbox import submit_message  # noqa: E402
from bot.app import allocator  # noqa: E402
from bot.memory.compaction import KIND as COMPACT  # noqa: E402
from bot.runtime import Runner  # noqa: E402
from store import DONE, TERMINAL, Store, new_id  # noqa: E402
from store.schema import tasks  # noqa: E402

TURN_TIMEOUT = 120.0  # seconds; a turn stuck longer fails the run (the machine may be loaded)
CHECKPOINTS = 10  # the default of --checkpoints
WARMUP_SHARE = 0.3  # the growth is measured from the checkpoint at 30% of the turns at
# the earliest, and not before the context cache is full (see the docstring)
DEFAULT_WINDOW = 128_000  # [llm] context_window's default, that MAX_CACHE_BYTES is sized for
THRESHOLD_WHY = (
    "1 KB/turn: what one object kept per turn costs (a Future and its dict slot, an Entry, "
    "a request); at 100 turns a day that is 36 MB a year, and it never stops. The noise "
    "floor after warm-up is a small fraction of it (bounded caches are full by then).")
WORDS = ("invoice meeting thursday budget review agenda client project deadline summary notes "
         "draft quarter travel dentist birthday groceries report contract insurance").split()


class SoakStore(CountingStore):
    """bench/agent.py's counting store, but a future only for a task someone waits for, and
    only until it ends: CountingStore keeps one for every task that ever ended, right for a
    few hundred turns and a leak of its own in a soak. `sqlite_cache_kib` and
    `sql_cache_size` (set from the command line) retune the caches outside tracemalloc."""

    sqlite_cache_kib: int | None = None
    sql_cache_size: int | None = None

    def __init__(self, engines):
        super().__init__(engines)
        if self.sql_cache_size is not None:
            for engine in {engines.write, engines.read}:
                engine.sync_engine._compiled_cache = (LRUCache(self.sql_cache_size)
                                                      if self.sql_cache_size else None)
        if self.sqlite_cache_kib is not None and engines.dialect == "sqlite":
            pragma = f"PRAGMA cache_size=-{self.sqlite_cache_kib}"
            for engine in {engines.write, engines.read}:
                event.listen(engine.sync_engine, "connect",
                             lambda conn, _record: conn.execute(pragma))
            if engines.writer is not None:
                connect = engines.writer._connect

                def tuned():
                    conn = connect()
                    conn.execute(pragma)
                    return conn

                engines.writer._connect = tuned

    def settled(self, task_id: str) -> asyncio.Future:
        """Call right after the commit that created the task (no await in between)."""
        return self._settled.setdefault(task_id, asyncio.get_running_loop().create_future())

    async def commit(self, writes, **options):
        self.counts["commits"] += 1
        result = await Store.commit(self, writes, **options)
        update = writes.task_update
        if update is not None and update.state in TERMINAL:
            waiter = self._settled.pop(update.task_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(time.perf_counter())
        return result


def soak_agent(url: str, home: Path, context_window: int):
    """bench.agent.serving_agent with the soak's store and context window."""
    window = {"context_window": context_window,
              "max_output_tokens": min(4096, context_window // 8)}
    # Compaction scaled to the window as the defaults are to 128k (16k reserve, 20k kept).
    compaction = {"reserve_tokens": context_window // 8, "keep_recent_tokens": context_window // 6}
    return serving_agent(url, home, store_class=SoakStore,
                         settings={"llm": window, "compaction": compaction})


def traffic(turns: int, conversations: int, hot: int, hot_share: float,
            rng: random.Random) -> list[str]:
    """The conversation key of each turn, in order."""
    cold = max(conversations - hot, 1)
    return [f"soak:hot:{rng.randrange(hot)}" if hot and rng.random() < hot_share
            else f"soak:{rng.randrange(cold)}" for _ in range(turns)]


def deep_size(obj, seen: set[int] | None = None) -> int:
    """Bytes held by `obj` and everything it references (containers, dataclasses)."""
    seen = set() if seen is None else seen
    total, stack = 0, [obj]
    while stack:
        o = stack.pop()
        if id(o) in seen or o is None or isinstance(o, bool | type):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset):
            stack.extend(o)
        elif dataclasses.is_dataclass(o):  # not o.__dict__: that would create it (3.11+)
            stack.extend(getattr(o, f.name) for f in dataclasses.fields(o))
    return total


def _sqlite_memory_used():
    """sqlite3_memory_used() of the SQLite library this process runs (page caches of every
    connection included), or None where it cannot be called."""
    try:
        import _sqlite3

        function = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_used
    except (ImportError, OSError, AttributeError):
        return None
    function.restype = ctypes.c_int64
    return function


SQLITE_MEMORY_USED = _sqlite_memory_used()


def _sqlite_highwater():
    """sqlite3_memory_highwater(reset): SQLite's peak memory since the last reset."""
    try:
        import _sqlite3

        function = ctypes.CDLL(_sqlite3.__file__).sqlite3_memory_highwater
    except (ImportError, OSError, AttributeError):
        return None
    function.restype = ctypes.c_int64
    function.argtypes = (ctypes.c_int,)
    return function


SQLITE_HIGHWATER = _sqlite_highwater()


HEAP_RESERVATION_KB = 65536  # a glibc thread arena's heap: 64 MiB reserved, rw as it grows


def memory_map() -> dict:
    """Where the RSS is (Linux: /proc/self/smaps): glibc's main arena (`[heap]`), its
    thread arenas (each a 64 MiB reservation, a read-write part and the rest ---p) and the
    rest of anonymous memory (pymalloc's arenas, big blocks malloc mmaps on its own)."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return {"heap MB": 0.0, "arenas": 0, "arena MB": 0.0, "anon MB": 0.0}
    maps = []
    for line in lines:
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            maps.append({"kb": (hi - lo) >> 10, "perm": head[1],
                         "name": head[5] if len(head) > 5 else "", "rss": 0})
        elif head[0] == "Rss:":
            maps[-1]["rss"] = int(head[1])
    anon = [m for m in maps if not m["name"]]
    arenas = [a for a, b in zip(anon, anon[1:], strict=False)
              if a["perm"].startswith("rw") and b["perm"].startswith("---")
              and a["kb"] + b["kb"] == HEAP_RESERVATION_KB]
    arena_kb = sum(a["rss"] for a in arenas)
    return {"heap MB": sum(m["rss"] for m in maps if m["name"] == "[heap]") / 1024,
            "arenas": len(arenas), "arena MB": arena_kb / 1024,
            "anon MB": (sum(m["rss"] for m in anon) - arena_kb) / 1024}


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mallinfo2():
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _Mallinfo2
    return function


MALLINFO2 = _mallinfo2()


def malloc_split() -> dict:
    """glibc malloc over all its arenas (mallinfo2): bytes handed out and still in use
    (`malloc used`, mmapped blocks included) and bytes free inside the arenas (`malloc
    free`: freed chunks malloc keeps, fragmentation). Live data that grows shows in the
    first; an allocator that keeps what was freed, in the second."""
    if MALLINFO2 is None:
        return {"malloc used MB": 0.0, "malloc free MB": 0.0, "free chunks": 0, "mmapped": 0}
    m = MALLINFO2()
    return {"malloc used MB": (m.uordblks + m.hblkhd) / 2**20, "malloc free MB": m.fordblks / 2**20,
            "free chunks": m.ordblks, "mmapped": m.hblks}


def pymalloc_split() -> dict:
    """pymalloc (objects of 512 bytes or less): bytes in allocated blocks and the arenas
    (1 MiB each since Python 3.10) it holds, from sys._debugmallocstats() (which writes to
    fd 2: caught here)."""
    with tempfile.TemporaryFile("w+") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    found = {}
    for line in text.splitlines():
        if "=" in line:
            name, _, value = line.rpartition("=")
            found[name.strip()] = value.strip().replace(",", "")
    try:
        return {"py MB": int(found["# bytes in allocated blocks"]) / 2**20,
                "py arenas": int(found["# arenas allocated current"])}
    except (KeyError, ValueError):
        return {"py MB": 0.0, "py arenas": 0}


def _compiled_statements() -> int:
    """Statements in every SQLAlchemy engine's compiled cache, the SQLite writer's own
    blocking engine (store/writer.py) included, found through the garbage collector."""
    from sqlalchemy.engine import Engine

    return sum(len(o._compiled_cache or ()) for o in gc.get_objects() if isinstance(o, Engine))


def _statement_caches(store: Store) -> tuple[int, int, int]:
    """(statements in SQLAlchemy's compiled caches, pooled connections, statements in their
    prepared-statement caches: SQLAlchemy's asyncpg adapter's and asyncpg's own)."""
    compiled = pooled = prepared = 0
    for engine in {store.engines.write, store.engines.read}:
        compiled += len(engine.sync_engine._compiled_cache or ())
        for record in list(engine.sync_engine.pool._pool._queue._queue):
            pooled += 1
            adapted = record.dbapi_connection
            prepared += len(getattr(adapted, "_prepared_statement_cache", None) or ())
            prepared += len(getattr(getattr(adapted, "_connection", None), "_stmt_cache",
                                    None) or ())
    return compiled, pooled, prepared


def structures(deps: AgentDeps, runner: Runner) -> dict:
    """The in-process structures keyed by conversation or by task, and the statement
    caches (bounded, but filled slowly by statements of many shapes)."""
    compiled, pooled, prepared = _statement_caches(deps.store)
    windows = deps.context_cache._windows
    queues = deps.events._queues
    cache = deps.context_cache
    return {"ctx convs": len(windows), "ctx held KB": cache.held_bytes() / 1024,
            "ctx full": cache.evicted > 0,
            "ctx entries": sum(len(w.entries) for _, _, w, *_ in windows.values()),
            "ctx KB": deep_size(windows) / 1024,
            "ev queues": len(queues),
            "ev queued": sum(q.qsize() for _, q in queues),
            "inflight": len(runner._inflight),
            "model reqs": len(deps.client.requests),
            "store futures": len(deps.store._settled),
            "sql cache": compiled, "all sql": _compiled_statements(), "conns": pooled,
            "prepared": prepared}


async def one_turn(deps: AgentDeps, runner: Runner, key: str, i: int, rng: random.Random,
                   ids: dict[str, int]) -> bool:
    """A client: subscribe to the conversation, submit, render its final answers as they
    come (as bot/app/chat.py does: a terminal delivery waits until its answer is written),
    until the turn has ended (answered, or covered by an earlier turn's answer when it came
    in while that one was working). True if this turn's own answer was shown."""
    conversation_id = ids.get(key)
    if conversation_id is None:
        conversation_id = ids[key] = (await deps.store.ensure_conversation(key)).id
    events = deps.events.subscribe(conversation_id)
    shown = False

    def render(event) -> None:
        nonlocal shown
        if event.kind != "final":
            return
        written = event.data.get("written")
        if written is not None and not written.done():
            written.set_result(None)
        shown |= event.data.get("key") == f"{accepted.turn_id}.answer"

    try:
        text = f"message {i}: {' '.join(rng.choices(WORDS, k=6))}, please echo this back"
        accepted = await submit_message(deps.store, channel="cli", external_ids=[new_id()],
                                        conversation_key=key, author="soak", text=text)
        runner.wake()
        settled = deps.store.settled(accepted.turn_id)
        async with asyncio.timeout(TURN_TIMEOUT):
            while not settled.done():
                arrival = asyncio.ensure_future(events.get())
                await asyncio.wait((arrival, settled), return_when=asyncio.FIRST_COMPLETED)
                if arrival.done():
                    render(arrival.result())
                else:
                    arrival.cancel()
        while not events.empty():
            render(events.get_nowait())
        return shown
    finally:
        deps.events.unsubscribe(events)


async def quiesce(deps: AgentDeps, runner: Runner) -> dict:
    """Wait until no task is in flight or ready (compactions and turns finishing after
    their answer was shown included); the task states then."""
    async with asyncio.timeout(TURN_TIMEOUT):
        while True:
            counts = await deps.store.count_tasks()
            if not runner._inflight and not (set(counts) - {DONE, "failed"}):
                return counts
            await asyncio.sleep(0.05)


async def compactions(store: Store) -> int:
    async with store.engines.read.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(tasks).where(
            tasks.c.kind == COMPACT, tasks.c.state == DONE))).scalar_one()


def _reset_peak() -> None:
    """VmHWM starts again from VmRSS (/proc/self/clear_refs "5"), so the next sample's
    `peak MB` is the highest RSS of the interval between two checkpoints."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


async def sample(deps: AgentDeps, runner: Runner, done: int, t0: float,
                 floor: bool = False) -> dict:
    """One checkpoint's row. `floor`: after the RSS is read, malloc_trim(0) once more and
    read it again (`trimmed MB`: what stays when every free page is handed back, the live
    data and fragmentation; `RSS MB`, the verdict's, is read before)."""
    deps.client.requests.clear()
    compacted = await compactions(deps.store)
    gc.collect()
    status = _proc_status()
    trimmed = None
    if floor:
        await asyncio.to_thread(allocator.trim)
        trimmed = _proc_status()["VmRSS"]
    _reset_peak()
    current = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    found = structures(deps, runner)
    lines = deep_size(linecache.cache) / 2**20
    return {"turns": done, "s": time.perf_counter() - t0,
            "RSS MB": status["VmRSS"], "peak MB": status["VmHWM"], "trimmed MB": trimmed,
            **memory_map(), **malloc_split(),
            **pymalloc_split(), "traced MB": current / 2**20,
            "linecache MB": lines, "net MB": current / 2**20 - found["ctx KB"] / 1024 - lines,
            "sqlite MB": SQLITE_MEMORY_USED() / 2**20 if SQLITE_MEMORY_USED else 0.0,
            "sqlite peak MB": SQLITE_HIGHWATER(1) / 2**20 if SQLITE_HIGHWATER else 0.0,
            "objects": len(gc.get_objects()), "compactions": compacted, **found}


class SqlPeaks:
    """Diagnosis (--sql-peaks): SQLite's peak memory above its level when each statement
    started, by statement (its first 90 characters), the largest per checkpoint interval.
    Statements run on several threads at once, so a peak may belong to a neighbour: read
    it as a ranking, not a measurement."""

    def __init__(self):
        from sqlalchemy.engine import Engine

        self.peaks: Counter = Counter()
        self.counts: Counter = Counter()
        event.listen(Engine, "before_cursor_execute", self._before)
        event.listen(Engine, "after_cursor_execute", self._after)

    @staticmethod
    def _before(conn, _cursor, _statement, _parameters, context, _many):
        conn.info["sql peak start"] = SQLITE_MEMORY_USED()
        SQLITE_HIGHWATER(1)

    def _after(self, conn, _cursor, statement, _parameters, _context, _many):
        start = conn.info.pop("sql peak start", None)
        if start is None:
            return
        key = " ".join(statement.split())[:90]
        self.peaks[key] = max(self.peaks[key], SQLITE_HIGHWATER(0) - start)
        self.counts[key] += 1

    def take(self, top: int = 5) -> list[tuple[str, float, int]]:
        found = [(k, v / 2**20, self.counts[k]) for k, v in self.peaks.most_common(top)]
        self.peaks.clear()
        self.counts.clear()
        return found


class Trims:
    """malloc_trim(0) every `seconds` in the default executor, as
    bot.app.allocator.trim_periodically does, timing each call."""

    def __init__(self, seconds: float):
        self.seconds, self.costs, self.released = seconds, [], 0

    def _trim(self) -> None:
        t = time.perf_counter()
        self.released += allocator.trim()
        self.costs.append(time.perf_counter() - t)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.seconds)
            await asyncio.to_thread(self._trim)

    def summary(self) -> dict:
        costs = sorted(self.costs) or [0.0]
        return {"every s": self.seconds, "trims": len(self.costs), "released": self.released,
                "p50 ms": costs[len(costs) // 2] * 1e3, "max ms": costs[-1] * 1e3}


def rss_steps(rows: list[dict]) -> list[float | None]:
    """RSS growth per 1000 turns from the checkpoint before to each one."""
    return [None] + [(b["RSS MB"] - a["RSS MB"]) * 1000 / max(b["turns"] - a["turns"], 1)
                     for a, b in zip(rows, rows[1:], strict=False)]


async def run_backend(url: str, args) -> dict:
    rng = random.Random(args.seed)
    plan = traffic(args.turns, args.conversations, args.hot, args.hot_share, rng)
    checkpoints, earliest = args.checkpoints, warmup_checkpoint(args.checkpoints)
    warmup = None  # the first checkpoint from `earliest` on with the context cache full
    bounds = [round(args.turns * k / checkpoints) for k in range(checkpoints + 1)]
    rows, snapshots = [], {}
    trims = Trims(args.trim_every) if args.trim_every else None
    trimming = asyncio.create_task(trims.run()) if trims else None
    peaks = SqlPeaks() if args.sql_peaks and SQLITE_HIGHWATER else None
    # Setup, blocking on purpose: a home directory for the config (the database is `url`).
    with tempfile.TemporaryDirectory(prefix="steward-soak-home-") as home:
        async with soak_agent(url, Path(home), args.context_window) as (deps, runner):
            ids: dict[str, int] = {}
            cache = deps.context_cache
            cache.max_bytes = args.context_cache_kib * 1024
            cache_bound = {"conversations": cache.max, "KiB": args.context_cache_kib}
            answered = Counter()
            t0 = time.perf_counter()
            counts = await quiesce(deps, runner)
            rows.append(await sample(deps, runner, 0, t0, args.trimmed_floor))
            for k in range(1, checkpoints + 1):
                todo = iter(range(bounds[k - 1], bounds[k]))

                async def worker(todo=todo):
                    for i in todo:
                        answered[await one_turn(deps, runner, plan[i], i, rng, ids)] += 1
                        deps.client.requests.clear()  # the scripted model keeps them all

                await asyncio.gather(*(worker() for _ in range(args.workers)))
                counts = await quiesce(deps, runner)
                rows.append(await sample(deps, runner, bounds[k], t0, args.trimmed_floor))
                if warmup is None and k >= earliest and rows[-1]["ctx full"]:
                    warmup = k
                if (k in (warmup, earliest, checkpoints) and tracemalloc.is_tracing()
                        and (k != earliest or warmup in (None, k))):
                    snapshots[k] = tracemalloc.take_snapshot().filter_traces(
                        [tracemalloc.Filter(False, tracemalloc.__file__)])
                if peaks is not None:
                    for statement, mb, n in peaks.take():
                        note(f"    sqlite peak {mb:6.2f} MB over {n:5} runs: {statement}")
                r, step = rows[-1], rss_steps(rows[-2:])[-1]
                note(f"  {bounds[k]}/{args.turns} turns, {r['s']:.0f}s, RSS {r['RSS MB']:.1f} MB "
                     f"({step:+.2f} MB per 1000 turns), traced {r['traced MB']:.2f} MB, "
                     f"context cache {r['ctx convs']} convs, {r['ctx held KB']:.0f} of "
                     f"{args.context_cache_kib} KiB{' (full)' if r['ctx full'] else ''}"
                     f"{' <- warm-up ends here' if warmup == k else ''}")
    if trimming is not None:
        trimming.cancel()
        await asyncio.gather(trimming, return_exceptions=True)
    full = warmup is not None
    warmup = warmup if full else earliest  # never full: measured from `earliest`, and said
    growth = [s for s in snapshots[checkpoints].compare_to(snapshots[warmup], "lineno")
              if s.size_diff > 0][:args.top] if snapshots else []
    turns = bounds[checkpoints] - bounds[warmup]
    per_k = {m: (rows[-1][m] - rows[warmup][m]) * 1000 / turns
             for m in ("RSS MB", "heap MB", "arena MB", "anon MB", "traced MB", "net MB",
                       "sqlite MB", "objects", "ctx KB", "linecache MB", "malloc used MB",
                       "malloc free MB", "peak MB")}
    if args.trimmed_floor:
        per_k["trimmed MB"] = (rows[-1]["trimmed MB"] - rows[warmup]["trimmed MB"]) * 1000 / turns
    for row, step in zip(rows, rss_steps(rows), strict=True):
        row["RSS/1k"] = step
    return {"checkpoints": rows, "warm-up checkpoint": warmup, "cache full": full,
            "rss only": args.rss_only,
            "task states": counts, "context cache bound": cache_bound,
            "turns answered / covered by an earlier answer": [answered[True], answered[False]],
            "growth per 1000 turns after warm-up": per_k,
            "malloc_trim": trims.summary() if trims else None,
            "top growth": [{"where": str(s.traceback), "KB": s.size_diff / 1024,
                            "blocks": s.count_diff} for s in growth]}


def warmup_checkpoint(checkpoints: int) -> int:
    return max(1, round(checkpoints * WARMUP_SHARE))


COLUMNS = (("turns", "{:>6}"), ("s", "{:>6.0f}"), ("RSS MB", "{:>8.1f}"), ("RSS/1k", "{:>8}"),
           ("peak MB", "{:>8.1f}"), ("trimmed MB", "{:>11.1f}"),
           ("heap MB", "{:>8.1f}"), ("arenas", "{:>7}"), ("arena MB", "{:>9.1f}"),
           ("anon MB", "{:>8.1f}"), ("malloc used MB", "{:>15.1f}"),
           ("malloc free MB", "{:>15.1f}"), ("free chunks", "{:>12}"), ("mmapped", "{:>8d}"),
           ("py MB", "{:>6.1f}"), ("py arenas", "{:>10}"), ("sqlite MB", "{:>10.1f}"),
           ("sqlite peak MB", "{:>15.1f}"), ("traced MB", "{:>10.2f}"),
           ("linecache MB", "{:>13.2f}"), ("net MB", "{:>7.2f}"),
           ("objects", "{:>9,}"), ("compactions", "{:>12}"), ("ctx convs", "{:>10}"),
           ("ctx entries", "{:>12}"), ("ctx KB", "{:>8.0f}"), ("ctx held KB", "{:>12.0f}"),
           ("ev queues", "{:>10}"), ("ev queued", "{:>10}"), ("inflight", "{:>9}"),
           ("model reqs", "{:>11}"), ("store futures", "{:>14}"), ("sql cache", "{:>10}"),
           ("all sql", "{:>8d}"), ("conns", "{:>6}"), ("prepared", "{:>9}"))


def verdict(result: dict, limit_kb: float, limit_rss_mb: float) -> tuple[bool, str]:
    """PASS when the traced memory outside the context cache (and linecache) grows at most
    `limit_kb` per 1000 turns after warm-up, and the cache stays within its bound (its
    windows are each bounded by the window budget; what it holds is measured, not guessed).
    With --rss-only: when RSS itself grows at most `limit_rss_mb` per 1000 turns."""
    growth = result["growth per 1000 turns after warm-up"]
    rows = result["checkpoints"]
    most = max(row["ctx convs"] for row in rows)
    held = max(row["ctx held KB"] for row in rows)
    bound = result["context cache bound"]
    start = rows[result["warm-up checkpoint"]]["turns"]
    cache = (f"context cache at most {most} conversations, {held:.0f} KiB (bounds "
             f"{bound['conversations']}, {bound['KiB']} KiB), "
             + (f"full from the warm-up's end ({start} turns) on" if result["cache full"]
                else f"NOT full by the end: measured from {start} turns"))
    within = most <= bound["conversations"] and held <= bound["KiB"]
    if result["rss only"]:
        ok = growth["RSS MB"] <= limit_rss_mb and within
        return ok, (f"{'PASS' if ok else 'FAIL'}: RSS {growth['RSS MB']:+.2f} MB per 1000 "
                    f"turns after warm-up (limit {limit_rss_mb:.2f} MB); {cache}")
    net_kb = growth["net MB"] * 1024
    ok = net_kb <= limit_kb and within
    return ok, (f"{'PASS' if ok else 'FAIL'}: tracemalloc outside the context cache "
                f"{net_kb:+.0f} KB per 1000 turns (limit {limit_kb:.0f} KB); {cache}")


def _cell(fmt: str, value) -> str:
    if value is None:
        return " " * len(fmt.format(0))
    return fmt.format(f"{value:+.2f}") if fmt == "{:>8}" else fmt.format(value)


def report(name: str, result: dict, limit_kb: float, limit_rss_mb: float) -> bool:
    """Print one backend's table and verdict; True if it passes."""
    covered = result["turns answered / covered by an earlier answer"]
    print(f"\n{name}: task states at the end {result['task states']}; turns answered "
          f"{covered[0]}, covered by an earlier turn's answer {covered[1]}")
    print(" ".join(f"{c:>{len(fmt.format(0)) if c != 'turns' else 6}}" for c, fmt in COLUMNS))
    rows = result["checkpoints"]
    for row in rows:
        print(" ".join(_cell(fmt, row[c]) for c, fmt in COLUMNS))
    g = result["growth per 1000 turns after warm-up"]
    since = f"{rows[result['warm-up checkpoint']]['turns']} turns"
    print(f"{name}: growth per 1000 turns from {since} to the end: "
          f"RSS {g['RSS MB']:+.2f} MB (main heap {g['heap MB']:+.2f}, thread arenas "
          f"{g['arena MB']:+.2f}, other anonymous {g['anon MB']:+.2f}; SQLite's own "
          f"{g['sqlite MB']:+.2f} MB; glibc malloc in use {g['malloc used MB']:+.2f}, free in "
          f"its arenas {g['malloc free MB']:+.2f}), peak RSS {g['peak MB']:+.2f} MB"
          + (f", RSS after a malloc_trim {g['trimmed MB']:+.2f} MB" if "trimmed MB" in g else "")
          + f", gc objects {g['objects']:+,.0f}", end="")
    if result["rss only"]:
        print(f", the context cache's deep size {g['ctx KB']:+.0f} KB (no tracemalloc)")
    else:
        print(f", tracemalloc {g['traced MB'] * 1024:+.0f} KB, of which the context cache "
              f"{g['ctx KB']:+.0f} KB, linecache {g['linecache MB'] * 1024:+.0f} KB and the "
              f"rest {g['net MB'] * 1024:+.0f} KB")
        print(f"{name}: largest tracemalloc growth since {since}:")
        for s in result["top growth"]:
            print(f"    {s['KB']:+9.1f} KB {s['blocks']:+7} blocks  {s['where']}")
    if result["malloc_trim"]:
        t = result["malloc_trim"]
        print(f"{name}: malloc_trim(0) every {t['every s']:g} s: {t['trims']} calls, "
              f"{t['released']} released memory, p50 {t['p50 ms']:.2f} ms, "
              f"max {t['max ms']:.2f} ms (in a thread, off the loop)")
    ok, line = verdict(result, limit_kb, limit_rss_mb)
    print(f"{name}: {line}")
    return ok


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--turns", type=int, default=1200)
    parser.add_argument("--conversations", type=int, default=500)
    parser.add_argument("--hot", type=int, default=4, help="very active conversations")
    parser.add_argument("--hot-share", type=float, default=0.4,
                        help="the share of the turns that go to the very active ones")
    parser.add_argument("--workers", type=int, default=6, help="turns in flight at once")
    parser.add_argument("--context-window", type=int, default=6_000)
    parser.add_argument("--context-cache-kib", type=int, default=None,
                        help="the context cache's byte bound (default: its bound for the "
                             "default 128k-token window, scaled to --context-window)")
    parser.add_argument("--max-growth-kb", type=float, default=1024.0,
                        help="FAIL above this tracemalloc growth per 1000 turns")
    parser.add_argument("--top", type=int, default=8, help="growing lines shown")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rss-only", action="store_true",
                        help="no tracemalloc: sample RSS (and SQLite's own memory) only")
    parser.add_argument("--checkpoints", type=int, default=CHECKPOINTS)
    parser.add_argument("--max-rss-growth-mb", type=float, default=1.0,
                        help="with --rss-only: FAIL above this RSS growth per 1000 turns")
    parser.add_argument("--arena-max", type=int, default=0,
                        help="mallopt(M_ARENA_MAX, N) at start (0: glibc's default)")
    parser.add_argument("--trim-every", type=float, default=0.0,
                        help="malloc_trim(0) in a thread every S seconds (0: never)")
    parser.add_argument("--steward-allocator", action="store_true",
                        help="what `steward run` does: bot.app.allocator's defaults")
    parser.add_argument("--sqlite-cache-kib", type=int, default=None,
                        help="PRAGMA cache_size=-K on every SQLite connection")
    parser.add_argument("--trimmed-floor", action="store_true",
                        help="at every checkpoint, after RSS is read, malloc_trim(0) and "
                             "read it again (trimmed MB)")
    parser.add_argument("--sql-peaks", action="store_true",
                        help="diagnosis: print the statements with the largest SQLite peaks")
    parser.add_argument("--dense-scopes", action="store_true",
                        help="diagnosis only: store/search.py never takes its sparse-scope "
                             "plan on SQLite (SPARSE = 0)")
    parser.add_argument("--no-recall", action="store_true",
                        help="diagnosis only: turns assemble their context without recall")
    parser.add_argument("--sql-cache-size", type=int, default=None,
                        help="SQLAlchemy's compiled-statement cache size per engine")
    args = parser.parse_args()
    if args.context_cache_kib is None:
        args.context_cache_kib = round(MAX_CACHE_BYTES / 1024 * args.context_window
                                       / DEFAULT_WINDOW)
    if args.turns < args.checkpoints * 10:
        parser.error(f"--turns must be at least {args.checkpoints * 10}")
    if args.steward_allocator:
        args.arena_max = args.arena_max or allocator.ARENA_MAX
        args.trim_every = args.trim_every or allocator.TRIM_SECONDS
    if args.dense_scopes:
        import store.search

        store.search.SPARSE = 0
    if args.no_recall:
        import bot.agent.context as context

        async def nothing(*_args, **_kwargs) -> str:
            return ""

        context.recall_memories = nothing
    if args.arena_max:  # first, before this process starts any thread
        args.arena_max_applied = allocator.configure(args.arena_max)
    SoakStore.sqlite_cache_kib, SoakStore.sql_cache_size = (args.sqlite_cache_kib,
                                                            args.sql_cache_size)
    backends = {"sqlite": sqlite_url, "postgres": postgres_url}
    chosen = list(backends) if args.backend == "both" else [args.backend]
    if not args.rss_only:
        tracemalloc.start()
    note(f"allocator: glibc {'yes' if allocator.supported() else 'no'}, MALLOC_ARENA_MAX="
         f"{os.environ.get('MALLOC_ARENA_MAX', '')!r}, --arena-max {args.arena_max or '-'}"
         f"{' (applied)' if getattr(args, 'arena_max_applied', False) else ''}, "
         f"--trim-every {args.trim_every or '-'}; load average {os.getloadavg()[0]:.1f}")
    results = {}
    for name in chosen:
        note(f"{name}: {args.turns} turns over {args.conversations} conversations "
             f"({args.hot} hot: {args.hot_share:.0%} of the turns), {args.workers} at once")
        async with backends[name]() as url:
            results[name] = await run_backend(url, args)
    ok = True
    if args.json:
        print(json.dumps({"args": vars(args), **results}, indent=2))
        ok = all(verdict(r, args.max_growth_kb, args.max_rss_growth_mb)[0]
                 for r in results.values())
    else:
        for name, result in results.items():
            ok = report(name, result, args.max_growth_kb, args.max_rss_growth_mb) and ok
        print(f"\nload average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(f"threshold: {THRESHOLD_WHY}")
    return 0 if ok else 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main()))
