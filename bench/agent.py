"""Agent harness benchmark: the cost of one agent turn around a zero-latency model, on
SQLite and PostgreSQL, so later changes to the runtime, the agent or the store compare.

The agent is wired as `bot.app.wiring` wires it, with a `ScriptedModel` that calls the
`bench_echo` tool once, then answers in ~200 characters: a turn task, two llm_calls, a
tool_call and a delivery per turn.

A. sequential: one message at a time into one conversation: submit -> turn done (and ->
   answer shown); per task kind, created_at -> updated_at of the finished task;
B. throughput: all messages at once across 20 conversations.

Per turn: `Store.commit` calls, task claims, `next_due` polls, the store's reads and the
statements sent through SQLAlchemy (the fixed ones go to the driver directly); the p50 /
p99 of a commit and of a read; and the peak RSS of the process while each backend ran.

usage: .venv/bin/python bench/agent.py [--backend sqlite|postgres|both] [--turns 300]
           [--json]
"""

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import httpx
from sqlalchemy import event, func, select

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.store import (  # noqa: E402
    _proc_status,
    note,
    p50_p99,
    postgres_url,
    print_table,
    sqlite_url,
)
from bot.agent.deps import AgentDeps  # noqa: E402
from bot.agent.inbox import submit_message  # noqa: E402
from bot.app.config import build_config  # noqa: E402
from bot.app.wiring import build_registry, build_toolbox, runner_options  # noqa: E402
from bot.llm.scripted import ScriptedModel  # noqa: E402
from bot.llm.types import Request, Response, ToolCall  # noqa: E402
from bot.runtime import Policy, Runner  # noqa: E402
from bot.tools import tool  # noqa: E402
from connectors.terminal import TerminalChannel  # noqa: E402
from store import DONE, TERMINAL, Store, new_id  # noqa: E402
from store.engine import create_engines, migrate  # noqa: E402
from store.schema import tasks  # noqa: E402

CONVERSATIONS = 20
TURN_TIMEOUT = 60.0  # seconds; a turn stuck longer fails the run
KINDS = ("turn", "llm_call", "tool_call", "deliver")  # the tasks of one scripted turn
COUNTED = ("commits", "claims", "next_due polls", "reads", "statements through SQLAlchemy")
ANSWER = ("Done: the echo tool answered, so here is a final reply of about two hundred "
          "characters, long enough to stream in several chunks and to be stored, delivered "
          "and shown to the user like a real answer would.")


@tool(policy=Policy.SAFE)
async def bench_echo(text: str) -> str:
    """Return the text unchanged (a benchmark tool without any effect)."""
    return text


def script(request: Request) -> Response:
    """Call bench_echo once per turn: answer when the last assistant message in the context
    is this turn's tool call (a follow-up may be placed after its result), or when no tool
    is offered any more."""
    said = [m for m in request.messages if m.role == "assistant"]
    if not request.tools or (said and said[-1].tool_calls):
        return Response(text=ANSWER)
    last_user = next(m.content for m in reversed(request.messages) if m.role == "user")
    return Response(tool_calls=[ToolCall(id=f"echo_{new_id()}", name="bench_echo",
                                         arguments={"text": last_user})])


class CountingStore(Store):
    """The real store, counting its round trips and resolving `settled(task_id)` when the
    task's terminal commit returns."""

    def __init__(self, engines):
        super().__init__(engines)
        self.counts: Counter[str] = Counter()
        self._settled: dict[str, asyncio.Future] = {}
        for engine in {engines.write, engines.read}:
            event.listen(engine.sync_engine, "before_cursor_execute", self._statement)

        # Seconds each commit and read took, while `timing` (kept only then: a soak runs
        # this store for hours).
        self.timing = False
        self.times: dict[str, list[float]] = {"commit": [], "read": []}

    def _statement(self, *_args) -> None:
        # The fixed statements (store/hotpath.py, steps.py) and SQLite's reader threads go
        # to the driver directly, past this count.
        self.counts["statements through SQLAlchemy"] += 1

    async def _read(self, fn):
        return await self._counted_read(super()._read, fn)

    async def _lookup(self, fn):
        return await self._counted_read(super()._lookup, fn)

    async def _counted_read(self, read, fn):
        self.counts["reads"] += 1
        start = time.perf_counter()
        try:
            return await read(fn)
        finally:
            if self.timing:
                self.times["read"].append(time.perf_counter() - start)

    def settled(self, task_id: str) -> asyncio.Future:
        """Resolves to the perf_counter time the task's terminal commit returned."""
        return self._settled.setdefault(task_id, asyncio.get_running_loop().create_future())

    async def commit(self, writes, *, then_claim=None):
        self.counts["commits"] += 1
        if then_claim is not None:
            self.counts["claims riding on a commit"] += 1
        start = time.perf_counter()
        result = await super().commit(writes, then_claim=then_claim)
        if self.timing:
            self.times["commit"].append(time.perf_counter() - start)
        if writes.task_update and writes.task_update.state in TERMINAL:
            self.settled(writes.task_update.task_id).set_result(time.perf_counter())
        return result

    async def claim(self, c):
        self.counts["claims"] += 1
        return await super().claim(c)

    async def next_due(self):
        self.counts["next_due polls"] += 1
        return await super().next_due()


@asynccontextmanager
async def serving_agent(url: str, home: Path, *, store_class: type | None = None,
                        settings: dict | None = None):
    """The agent of `bot.app.wiring.open_app`, with the scripted model and a counting store
    (`store_class`, a CountingStore), its runner serving in the background until the block
    ends. `settings`: config sections beside the store's."""
    config = build_config({**(settings or {}), "store": {"url": url}}, home=home)
    async with AsyncExitStack() as stack:
        store = (store_class or CountingStore)(create_engines(config.store_url))
        stack.push_async_callback(store.close)
        await migrate(store.engines)
        http = await stack.enter_async_context(httpx.AsyncClient())
        deps = AgentDeps(store=store, config=config, client=ScriptedModel(script, delay=0),
                         toolbox=await build_toolbox(config), http=http)
        deps.toolbox.register(bench_echo)
        deps.channels["cli"] = TerminalChannel(deps.events)
        runner = Runner(store, build_registry(deps), runner_options(config))
        deps.wake = runner.wake
        await runner.recover(steal_all=True)
        serving = asyncio.create_task(runner.run())
        try:
            yield deps, runner
        finally:
            await runner.drain(config.runtime.drain_seconds)
            await serving


async def submit(deps: AgentDeps, runner: Runner, conversation_key: str, i: int) -> str:
    accepted = await submit_message(deps.store, channel="cli", external_ids=[new_id()],
                                    conversation_key=conversation_key, author="bench",
                                    text=f"message {i}: please echo this line back to me")
    runner.wake()
    return accepted.turn_id


async def finished_tasks(store: Store, **where) -> list:
    """Kind, times and stored input size of the tasks matching `where`, checked to have
    all ended `done`."""
    query = select(tasks.c.id, tasks.c.kind, tasks.c.state, tasks.c.created_at, tasks.c.updated_at,
                   func.length(tasks.c.inputs).label("size")).order_by(tasks.c.id)
    for column, value in where.items():
        query = query.where(tasks.c[column] == value)
    async with store.engines.read.connect() as conn:
        rows = (await conn.execute(query)).all()
    states = Counter(r.state for r in rows)
    if set(states) - {DONE}:
        raise RuntimeError(f"tasks did not all finish: {dict(states)}")
    return rows


async def request_chars(store: Store, task_id: str) -> int:
    """The size of the request an answered llm_call sent (its inputs keep the outline)."""
    return (await store.get_task(task_id)).inputs["request_outline"]["chars"]


def per_turn(store: CountingStore, before: Counter, n: int, label: str) -> dict:
    return {f"{label} {name}/turn": (store.counts[name] - before[name]) / n
            for name in COUNTED}


async def bench_sequential(deps: AgentDeps, runner: Runner, n: int) -> dict:
    store: CountingStore = deps.store
    events = deps.events.subscribe()
    before, turn_ids, done, shown = Counter(store.counts), [], [], []
    store.timing = True
    t0 = time.perf_counter()
    try:
        for i in range(n):
            start = time.perf_counter()
            turn_ids.append(await submit(deps, runner, "bench:sequential", i))
            async with asyncio.timeout(TURN_TIMEOUT):
                while (await events.get()).kind != "final":
                    pass
                shown.append(time.perf_counter() - start)
                done.append(await store.settled(turn_ids[-1]) - start)
            deps.client.requests.clear()  # the scripted model keeps every request
    finally:
        deps.events.unsubscribe(events)
    wall = time.perf_counter() - t0
    store.timing = False
    conversation_id = (await store.get_task(turn_ids[0])).conversation_id
    rows = await finished_tasks(store, conversation_id=conversation_id)
    kinds = list(KINDS) + sorted({r.kind for r in rows} - set(KINDS))
    llm = [r for r in rows if r.kind == "llm_call"]
    tenth = max(n // 10, 1)
    out = {"A sequential turns/s": n / wall,
           "A submit->done p50/p99 (ms)": p50_p99(done),
           "A submit->answer shown p50/p99 (ms)": p50_p99(shown),
           "A submit->done median, first/last 10% (ms)": [
               statistics.median(done[:tenth]) * 1000, statistics.median(done[-tenth:]) * 1000],
           f"A tasks/turn ({'/'.join(kinds)})": [
               sum(r.kind == kind for r in rows) / n for kind in kinds],
           "A llm_call request sent, first/last (KB)": [
               (await request_chars(store, llm[0].id)) / 1024,
               (await request_chars(store, llm[-1].id)) / 1024],
           "A llm_call inputs kept, first/last (KB)": [llm[0].size / 1024,
                                                       llm[-1].size / 1024]}
    for what, seconds in store.times.items():  # the store's calls made in this part
        out[f"A {what} p50/p99 (ms)"] = p50_p99(seconds)
    for kind in kinds:
        out[f"A {kind} created->done p50/p99 (ms)"] = p50_p99(
            [r.updated_at - r.created_at for r in rows if r.kind == kind])
    return out | per_turn(store, before, n, "A")


async def bench_throughput(deps: AgentDeps, runner: Runner, n: int) -> dict:
    store: CountingStore = deps.store
    before, tasks_before = Counter(store.counts), len(await finished_tasks(store))
    t0 = time.perf_counter()
    turn_ids = await asyncio.gather(*(submit(deps, runner, f"bench:parallel:{i % CONVERSATIONS}",
                                             i) for i in range(n)))
    await asyncio.gather(*(store.settled(t) for t in turn_ids))
    wall = time.perf_counter() - t0
    deps.client.requests.clear()
    tasks_after = len(await finished_tasks(store))
    mine = set(turn_ids)
    covered = sum(t.id in mine and "covered_by" in (t.result or {})
                  for t in await store.list_tasks(kind="turn", limit=10 * n))
    return {f"B {CONVERSATIONS} conversations turns/s": n / wall,
            "B turns answered by an earlier turn": covered,
            "B tasks/turn": (tasks_after - tasks_before) / n,
            **per_turn(store, before, n, "B")}


async def run_backend(url: str, turns: int) -> dict:
    await asyncio.to_thread(_proc_status, True)  # restarts the peak
    # Setup, blocking on purpose: a home directory for the config (the database is `url`).
    with tempfile.TemporaryDirectory(prefix="steward-bench-home-") as home:
        async with serving_agent(url, Path(home)) as (deps, runner):
            note(f"  A: {turns} turns, one at a time, one conversation")
            results = await bench_sequential(deps, runner, turns)
            note(f"  B: {turns} turns at once, {CONVERSATIONS} conversations")
            results.update(await bench_throughput(deps, runner, turns))
    results["peak RSS (MB)"] = (await asyncio.to_thread(_proc_status))["VmHWM"]
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    backends = {"sqlite": sqlite_url, "postgres": postgres_url}
    chosen = list(backends) if args.backend == "both" else [args.backend]
    figures = {}
    for name in chosen:
        note(f"{name}:")
        async with backends[name]() as url:
            figures[name] = await run_backend(url, args.turns)
    if args.json:
        print(json.dumps({"turns": args.turns, **figures}, indent=2))
        return
    print_table(figures)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
