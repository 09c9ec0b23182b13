"""Embedding an import in the background (issue: memory): embedding a 10^5-entry import must
not block answering messages, and memory stays flat while it runs. SQLite.

1. A JSONL history of --entries messages (DESIGN.md format, ~180 characters each, three
   sessions of the local user, so the turns' automatic recall searches it) is imported
   through `import_file` into a fresh store, with the agent of `bot.app.wiring` serving:
   the scripted zero-latency model and tool of bench/agent.py, `[embeddings] provider =
   "openai"` against a fake OpenAI-compatible provider (tests/fakes/embedding_server.py's,
   answering from a pool of precomputed vectors after a fixed --delay, on its own event
   loop in a thread so its work is not charged to the agent's loop; `hybrid` off, the
   default, so a turn costs the same before and after the vectors exist).
2. Idle: --idle-turns turns, one a second (submit -> answer shown), no embedding running.
3. Embedding: the `embed_entries` task is spawned as the app does when it opens, and the
   real Runner embeds everything while a turn is answered every second (the same
   conversation). RSS at the start, at every 20% of the entries embedded, and at the end.

Prints the embedding throughput, turn p50/p99 idle and while embedding (and the ratios),
RSS along the way and its growth. FAIL (exit status 1) if the p99 while embedding is over
5x the idle p99, or RSS grows by more than 50 MB from the start of the embedding.

usage: .venv/bin/python bench/embed_import.py [--entries 100000] [--delay 0.01]
           [--idle-turns 30] [--batch 64] [--json]
"""

import argparse
import asyncio
import json
import logging
import random
import statistics
import sys
import tempfile
import threading
import time
import zlib
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
from aiohttp import web
from sqlalchemy import text

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.agent import bench_echo, script, submit  # noqa: E402
from bench.store import _proc_status, fmt, note, p50_p99, sqlite_url  # noqa: E402
from bot.agent.deps import AgentDeps  # noqa: E402
from bot.app import allocator  # noqa: E402
from bot.app.config import build_config  # noqa: E402
from bot.app.importers import import_file  # noqa: E402
from bot.app.wiring import build_registry, build_toolbox, runner_options  # noqa: E402
from bot.llm.scripted import ScriptedModel  # noqa: E402
from bot.memory import embeddings as _embeddings  # noqa: E402
from bot.memory.embedding_task import EMBED, ensure_embedding  # noqa: E402
from bot.runtime import Runner  # noqa: E402
from connectors.terminal import TerminalChannel  # noqa: E402
from store import Store  # noqa: E402
from store.engine import create_engines, migrate  # noqa: E402
from tests.fakes.embedding_server import FakeEmbeddings  # noqa: E402

P99_LIMIT = 5.0  # turn p99 while embedding over idle, at most
RSS_LIMIT = 50.0  # MB of growth while embedding, at most
POOL = 1024  # distinct vectors the fake provider answers with
TURN_TIMEOUT = 60.0
SESSION = "bench:embed-turns"
WORDS = ("climbing gym puppy biscuit invoice quarter budget release train monday lunch noon "
         "meeting thursday notes draft review agenda client project deadline summary ticket "
         "flight hotel berlin dentist birthday present garden tomatoes recipe lasagna bike "
         "repair insurance landlord heating contract renewal password router printer").split()


class PooledEmbeddings(FakeEmbeddings):
    """The fake provider, cheap: each text gets one of `POOL` precomputed unit vectors (by
    its CRC), the answer is assembled from their pre-serialized JSON after `delay` seconds
    (a local embedding server's time per batch), and no text is kept (the bench measures
    the agent's memory, not the fake's)."""

    def __init__(self, *, delay: float, dimensions: int):
        super().__init__(dimensions=dimensions)
        self.delay, self.answered = delay, 0
        rng = random.Random(7)
        self._pool = []
        for _ in range(POOL):
            v = [rng.gauss(0, 1) for _ in range(dimensions)]
            norm = sum(x * x for x in v) ** 0.5
            self._pool.append("[" + ",".join(f"{x / norm:.7f}" for x in v) + "]")

    async def _embeddings(self, request: web.Request) -> web.Response:
        self.requests += 1
        inputs = (await request.json())["input"]
        await asyncio.sleep(self.delay)
        data = ",".join(f'{{"object":"embedding","index":{i},"embedding":'
                        f'{self._pool[zlib.crc32(t.encode()) % POOL]}}}'
                        for i, t in enumerate(inputs))
        self.answered += len(inputs)
        return web.Response(text=f'{{"object":"list","model":"{self.model}","data":[{data}],'
                            '"usage":{"prompt_tokens":0,"total_tokens":0}}',
                            content_type="application/json")


class ProviderThread:
    """`PooledEmbeddings` served from a thread with its own event loop."""

    def __init__(self, **kw):
        self.fake = PooledEmbeddings(**kw)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self.fake:
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> PooledEmbeddings:
        self._thread.start()
        self._ready.wait(10)
        return self.fake

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def write_history(path: Path, n: int) -> None:
    """Blocking: the JSONL file of `n` messages."""
    rng = random.Random(1)
    sessions = ["slack:T1:D-anna", "slack:T1:C-team:1.0", "cli:notes"]
    t0 = 1_600_000_000
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(rng.choices(WORDS, k=rng.randint(15, 40)))
            f.write(json.dumps({"session": sessions[i % 3],
                                "role": "user" if i % 2 == 0 else "assistant",
                                "author": "Anna" if i % 2 == 0 else "Steward",
                                "text": f"{words} #{i}", "ts": t0 + 60 * i,
                                "ref": f"msg-{i}"}) + "\n")


@asynccontextmanager
async def embedding_agent(url: str, home: Path, provider: FakeEmbeddings, batch: int):
    """The agent of `bot.app.wiring.open_app` with `[embeddings]` pointed at the fake, the
    scripted model of bench/agent.py; its runner serves in the background until the block
    ends. The embedding task is not spawned here (`ensure_embedding` starts it)."""
    config = build_config({"store": {"url": url},
                           "embeddings": {"provider": "openai", "base_url": provider.base_url,
                                          "model": provider.model, "batch_size": batch}},
                          home=home)
    async with AsyncExitStack() as stack:
        store = Store(create_engines(config.store_url))
        stack.push_async_callback(store.close)
        await migrate(store.engines)
        http = await stack.enter_async_context(httpx.AsyncClient(
            timeout=httpx.Timeout(60.0, connect=10.0)))
        embedder = _embeddings.make(config, http)  # as open_app: before the registry
        _embeddings.attach(store, embedder)
        deps = AgentDeps(store=store, config=config, client=ScriptedModel(script, delay=0),
                         toolbox=await build_toolbox(config), http=http)
        deps.toolbox.register(bench_echo)
        deps.channels["cli"] = TerminalChannel(deps.events)
        runner = Runner(store, build_registry(deps), runner_options(config))
        deps.wake = runner.wake
        await runner.recover(steal_all=True)
        serving = asyncio.create_task(runner.run())
        trimming = asyncio.create_task(allocator.trim_periodically())  # as `steward run`
        try:
            yield deps, runner, embedder
        finally:
            trimming.cancel()
            await runner.drain(config.runtime.drain_seconds)
            await serving


async def one_turn(deps: AgentDeps, runner: Runner, events, i: int) -> float:
    """Seconds from submit to the answer shown."""
    start = time.perf_counter()
    await submit(deps, runner, SESSION, i)
    async with asyncio.timeout(TURN_TIMEOUT):
        while (await events.get()).kind != "final":
            pass
    deps.client.requests.clear()  # the scripted model keeps every request
    return time.perf_counter() - start


async def turns_every_second(deps, runner, events, first: int, *, count: int | None = None,
                             until: asyncio.Event | None = None) -> list[float]:
    """A turn each second (the next one at once if one took longer), `count` of them or
    until `until` is set."""
    latencies, i = [], first
    next_at = time.perf_counter()
    while (count is None or len(latencies) < count) and not (
            until and until.is_set() and len(latencies) >= 2):  # p99 needs two
        latencies.append(await one_turn(deps, runner, events, i))
        i += 1
        next_at += 1.0
        wait = next_at - time.perf_counter()
        if wait > 0:
            if until is None or until.is_set():
                await asyncio.sleep(wait)
            else:
                try:
                    await asyncio.wait_for(until.wait(), wait)
                except TimeoutError:
                    pass
        else:
            next_at = time.perf_counter()
    return latencies


def rss() -> float:
    return _proc_status()["VmRSS"]


async def vector_count(store: Store) -> int:
    async with store.engines.read.connect() as conn:
        return await conn.scalar(text("SELECT count(*) FROM entry_vectors"))


async def searchable_count(store: Store) -> int:
    async with store.engines.read.connect() as conn:
        return await conn.scalar(text(
            "SELECT count(*) FROM entries WHERE kind IN ('user', 'assistant', 'tool_result', "
            "'compaction') AND text != ''"))


async def run(args) -> dict:
    out: dict = {"entries": args.entries}
    out["RSS at process start (MB)"] = rss()
    with tempfile.TemporaryDirectory(prefix="steward-bench-embed-") as home, \
            ProviderThread(delay=args.delay, dimensions=args.dimensions) as provider:
        history = Path(home) / "history.jsonl"
        note(f"writing {args.entries:,} messages")
        await asyncio.to_thread(write_history, history, args.entries)
        async with sqlite_url() as url, \
                embedding_agent(url, Path(home), provider, args.batch) as (deps, runner, _):
            store = deps.store
            note("importing")
            t0 = time.perf_counter()
            report = await import_file(store, history, "jsonl")
            out["import (s)"] = time.perf_counter() - t0
            out["import (messages/s)"] = report.added / out["import (s)"]
            if report.added != args.entries:
                raise RuntimeError(f"imported {report.added} of {args.entries}")
            events = deps.events.subscribe()
            n = 0
            for _ in range(5):  # warm-up, not counted
                await one_turn(deps, runner, events, n)
                n += 1
            note(f"idle: {args.idle_turns} turns, one a second")
            idle = await turns_every_second(deps, runner, events, n, count=args.idle_turns)
            n += len(idle)

            # Every searchable entry now: the imported ones and the turns' so far.
            target = await searchable_count(store)
            out["RSS at embedding start (MB)"] = start_rss = rss()
            samples = {0: start_rss}
            finished = asyncio.Event()
            times: dict[str, float] = {}

            async def watch() -> None:
                """RSS at every 20% of the entries answered by the provider; finished when
                every entry of the target has a vector."""
                marks = [20, 40, 60, 80]
                while True:
                    await asyncio.sleep(0.25)
                    done = provider.answered / target * 100
                    while marks and done >= marks[0]:
                        mark = marks.pop(0)
                        samples[mark] = rss()
                        note(f"  {mark}%: {provider.answered:,} embedded, "
                             f"RSS {samples[mark]:.1f} MB")
                    if provider.answered >= target and await vector_count(store) >= target:
                        times["done"] = time.perf_counter()
                        samples[100] = rss()
                        finished.set()
                        return

            note(f"embedding {target:,} entries while answering a turn a second")
            times["start"] = time.perf_counter()
            await ensure_embedding(store, _embeddings.attached(store))
            runner.wake()
            watching = asyncio.create_task(watch())
            busy = await turns_every_second(deps, runner, events, n, until=finished)
            await watching
            n += len(busy)
            deps.events.unsubscribe(events)
            seconds = times["done"] - times["start"]
            task = (await store.list_tasks(kind=EMBED))[0]
            vectors = await vector_count(store)
            missing = await searchable_count(store) - vectors
        out["RSS at end (MB)"] = end_rss = rss()

    out["embedded entries"] = vectors
    out["entries left without a vector (turns during the run)"] = missing
    out["embedding (s)"] = seconds
    out["embedding throughput (entries/s)"] = target / seconds
    out["provider requests"] = provider.requests
    out["embed task state"] = task.state
    out["idle turns"] = len(idle)
    out["turns while embedding"] = len(busy)
    out["turn idle p50/p99 (ms)"] = idle_q = p50_p99(idle)
    out["turn while embedding p50/p99 (ms)"] = busy_q = p50_p99(busy)
    out["turn while embedding max (ms)"] = max(busy) * 1000
    out["turn p50 ratio embedding/idle"] = busy_q[0] / idle_q[0]
    out["turn p99 ratio embedding/idle"] = p99_ratio = busy_q[1] / idle_q[1]
    for pct in sorted(samples):
        out[f"RSS at {pct}% embedded (MB)"] = samples[pct]
    out["RSS growth, start -> end (MB)"] = end_rss - start_rss
    out["RSS growth, start -> highest sample (MB)"] = growth = max(
        [*samples.values(), end_rss]) - start_rss
    failures = []
    if p99_ratio > P99_LIMIT:
        failures.append(f"turn p99 while embedding is {p99_ratio:.1f}x idle (limit "
                        f"{P99_LIMIT:g}x)")
    if growth > RSS_LIMIT:
        failures.append(f"RSS grew {growth:.1f} MB while embedding (limit {RSS_LIMIT:g} MB)")
    if vectors < target:
        failures.append(f"only {vectors} of {target} entries embedded")
    out["failures"] = failures
    out["median turn idle (ms)"] = statistics.median(idle) * 1000
    return out


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--delay", type=float, default=0.01,
                        help="seconds the fake provider takes per request")
    parser.add_argument("--idle-turns", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64, help="[embeddings] batch_size")
    parser.add_argument("--dimensions", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = await run(args)
    failures = results.pop("failures")
    if args.json:
        print(json.dumps({**results, "failures": failures, "ok": not failures}, indent=2))
    else:
        width = max(len(m) for m in results) + 2
        for metric, value in results.items():
            shown = value if isinstance(value, str) else fmt(value)
            print(f"{metric:<{width}}{shown}")
        for failure in failures:
            print(f"FAIL: {failure}")
        if not failures:
            print("ok: turns are not blocked and memory stays flat while embedding")
    return 1 if failures else 0


if __name__ == "__main__":
    allocator.configure()  # as `steward run`: before the first thread
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main()))
