"""Agent harness benchmark: what one agent turn costs around a zero-latency model, on
SQLite and PostgreSQL, so later changes to the runtime, the agent or the store compare.

The agent is wired as `bot.app` wires it (toolbox, registry, runner options, terminal
channel), with a `ScriptedModel` that calls the `bench_echo` tool once, then answers in
~200 characters: each turn is a turn task, two llm_call tasks, a tool_call and a delivery.

A. sequential: one message at a time into one conversation, submit -> turn done (and
   -> answer shown); per task kind, created_at -> updated_at of the finished task;
B. throughput: all messages at once across 20 conversations.

Per turn, both count `Store.commit` calls, task claims, `next_due` polls and SQL
statements; each backend reports the peak RSS of the process while it ran.

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
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from sqlalchemy import event

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.store import fmt, note, p50_p99, postgres_url, sqlite_url  # noqa: E402
from bot.agent.deps import AgentDeps  # noqa: E402
from bot.agent.inbox import submit_message  # noqa: E402
from bot.app import build_registry, build_toolbox, runner_options  # noqa: E402
from bot.config import build_config  # noqa: E402
from bot.llm.scripted import ScriptedModel  # noqa: E402
from bot.llm.types import Request, Response, ToolCall  # noqa: E402
from bot.runtime import Policy, Runner  # noqa: E402
from bot.tools import tool  # noqa: E402
from connectors.terminal import TerminalChannel  # noqa: E402
from store import DONE, TERMINAL, Store, new_id  # noqa: E402
from store.engine import create_engines, migrate  # noqa: E402

CONVERSATIONS = 20
KINDS = {"turn": 1, "llm_call": 2, "tool_call": 1, "deliver": 1}  # tasks per turn
COUNTED = ("commits", "claims", "next_due polls", "SQL statements")
ANSWER = ("Done: the echo tool answered, so here is a final reply of about two hundred "
          "characters, long enough to stream in several chunks and to be stored, delivered "
          "and shown to the user like a real answer would.")


@tool(policy=Policy.SAFE)
async def bench_echo(text: str) -> str:
    """Return the text unchanged (a benchmark tool without any effect)."""
    return text


def script(request: Request) -> Response:
    """Call bench_echo on the user's message; answer once its result is in."""
    last = request.messages[-1]
    if last.role == "tool":
        return Response(text=ANSWER)
    return Response(tool_calls=[ToolCall(id=f"echo_{new_id()}", name="bench_echo",
                                         arguments={"text": last.content})])


class CountingStore(Store):
    """The real store, counting its round trips and resolving `settled(task_id)` when the
    task's terminal commit returns."""

    def __init__(self, engines):
        super().__init__(engines)
        self.counts: Counter[str] = Counter()
        self._settled: dict[str, asyncio.Future] = {}
        for engine in {engines.write, engines.read}:
            event.listen(engine.sync_engine, "before_cursor_execute", self._statement)

    def _statement(self, *_args) -> None:
        self.counts["SQL statements"] += 1

    def settled(self, task_id: str) -> asyncio.Future:
        if task_id not in self._settled:
            self._settled[task_id] = asyncio.get_running_loop().create_future()
        return self._settled[task_id]

    async def commit(self, writes):
        self.counts["commits"] += 1
        result = await super().commit(writes)
        update = writes.task_update
        if update is not None and update.state in TERMINAL:
            future = self.settled(update.task_id)
            if not future.done():
                future.set_result(time.perf_counter())
        return result

    async def claim_tasks(self, owner, limit, lease_seconds):
        self.counts["claims"] += 1
        return await super().claim_tasks(owner, limit, lease_seconds)

    async def next_due(self):
        self.counts["next_due polls"] += 1
        return await super().next_due()


@asynccontextmanager
async def serving_agent(url: str, home: Path):
    """The agent of `bot.app.open_app`, with the scripted model and a counting store, its
    runner serving in the background until the block ends."""
    config = build_config({"store": {"url": url}}, home=home)
    engines = create_engines(config.store_url)
    await migrate(engines)
    store = CountingStore(engines)
    try:
        async with httpx.AsyncClient() as http:
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
    finally:
        await store.close()


async def submit(deps: AgentDeps, runner: Runner, conversation_key: str, i: int) -> str:
    accepted = await submit_message(deps.store, channel="cli", external_ids=[new_id()],
                                    conversation_key=conversation_key, author="bench",
                                    text=f"message {i}: please echo this line back to me")
    runner.wake()
    return accepted.turn_id


def check_done(tasks: list, n: int) -> None:
    kinds = Counter(t.kind for t in tasks if t.state == DONE)
    expected = {kind: per_turn * n for kind, per_turn in KINDS.items()}
    if len(tasks) != sum(expected.values()) or kinds != expected:
        raise RuntimeError(f"turns did not all finish as scripted: {kinds} != {expected}")


def per_turn(store: CountingStore, before: Counter, n: int, label: str) -> dict:
    return {f"{label} {name}/turn": (store.counts[name] - before[name]) / n
            for name in COUNTED}


async def bench_sequential(deps: AgentDeps, runner: Runner, n: int) -> dict:
    store: CountingStore = deps.store
    events = deps.events.subscribe()
    before, turn_ids, done, shown = Counter(store.counts), [], [], []
    t0 = time.perf_counter()
    try:
        for i in range(n):
            start = time.perf_counter()
            turn_ids.append(await submit(deps, runner, "bench:sequential", i))
            while (await events.get()).kind != "final":
                pass
            shown.append(time.perf_counter() - start)
            done.append(await store.settled(turn_ids[-1]) - start)
            deps.client.requests.clear()  # the scripted model keeps every request
    finally:
        deps.events.unsubscribe(events)
    wall = time.perf_counter() - t0
    turn = await store.get_task(turn_ids[0])
    tasks = await store.list_tasks(conversation_id=turn.conversation_id, limit=10 * n)
    check_done(tasks, n)
    tenth = max(n // 10, 1)
    out = {"A sequential turns/s": n / wall,
           "A submit->done p50/p99 (ms)": p50_p99(done),
           "A submit->answer shown p50/p99 (ms)": p50_p99(shown),
           "A submit->done median, first/last 10% (ms)": [
               statistics.median(done[:tenth]) * 1000, statistics.median(done[-tenth:]) * 1000]}
    for kind in KINDS:
        out[f"A {kind} created->done p50/p99 (ms)"] = p50_p99(
            [t.updated_at - t.created_at for t in tasks if t.kind == kind])
    return out | per_turn(store, before, n, "A")


async def bench_throughput(deps: AgentDeps, runner: Runner, n: int) -> dict:
    store: CountingStore = deps.store
    before = Counter(store.counts)
    t0 = time.perf_counter()
    turn_ids = await asyncio.gather(*(submit(deps, runner, f"bench:parallel:{i % CONVERSATIONS}",
                                             i) for i in range(n)))
    await asyncio.gather(*(store.settled(t) for t in turn_ids))
    wall = time.perf_counter() - t0
    deps.client.requests.clear()
    counts = await store.count_tasks()
    if set(counts) != {DONE}:
        raise RuntimeError(f"turns did not all finish as scripted: {counts}")
    return {f"B {CONVERSATIONS} conversations turns/s": n / wall,
            **per_turn(store, before, n, "B")}


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": VmHWM restarts from VmRSS
        f.write("5")


def _peak_rss_mb() -> float:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["VmHWM"].split()[0]) / 1024


async def run_backend(url: str, turns: int) -> dict:
    await asyncio.to_thread(_reset_peak_rss)
    # Setup, blocking on purpose: a home directory for the config (the database is `url`).
    with tempfile.TemporaryDirectory(prefix="steward-bench-home-") as home:
        async with serving_agent(url, Path(home)) as (deps, runner):
            note(f"  A: {turns} turns, one at a time, one conversation")
            results = await bench_sequential(deps, runner, turns)
            note(f"  B: {turns} turns at once, {CONVERSATIONS} conversations")
            results.update(await bench_throughput(deps, runner, turns))
    results["peak RSS (MB)"] = await asyncio.to_thread(_peak_rss_mb)
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
    width = max(len(m) for f in figures.values() for m in f) + 2
    print(f"{'backend':<10}{'metric':<{width}}value")
    for name, metrics in figures.items():
        for metric, value in metrics.items():
            print(f"{name:<10}{metric:<{width}}{fmt(value)}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
