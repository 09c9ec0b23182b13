"""A real process for the crash tests: runs effects of every replay policy through the
runtime, with kill points injected by STEWARD_KILL_AT. Every effect appends a line to an
outside ledger file, so the test can count how often the outside world saw it.

usage: python tests/crash_worker.py STORE_URL LEDGER [--concurrency N] [--slow SECONDS]
"""

import argparse
import asyncio
import logging
import os
import signal

from bot.runtime import Done, Effect, Policy, Registry, Runner, RunnerOptions, TaskDef, Wait
from bot.runtime.killpoints import kill_point
from store import open_store


def _append(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _read(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


class Counted(Effect):
    ledger = ""
    slow = 0.0

    async def perform(self, ctx):
        if self.policy is Policy.UNSAFE:
            await ctx.save_checkpoint({**ctx.checkpoint, "partial": "half"})
        if self.slow:
            await asyncio.sleep(self.slow)
        await asyncio.to_thread(_append, self.ledger, f"{ctx.task.id} {ctx.idem_key or '-'}")
        kill_point("in-effect", self.kind)
        return {"n": ctx.inputs["n"]}


class SafeCount(Counted):
    kind = "safe"
    policy = Policy.SAFE


class KeyedCount(Counted):
    kind = "keyed"
    policy = Policy.KEYED


class UnsafeCount(Counted):
    kind = "unsafe"
    policy = Policy.UNSAFE


class UnsafeReconciled(Counted):
    kind = "unsafe_rec"
    policy = Policy.UNSAFE

    async def reconcile(self, ctx):
        lines = await asyncio.to_thread(_read, self.ledger)
        if any(line.split()[0] == ctx.task.id for line in lines):
            return True, {"n": ctx.inputs["n"], "reconciled": True}
        return False, None


class Fanout(TaskDef):
    """A workflow: one child of each effect kind, then gather their states."""

    kind = "fanout"

    async def step(self, ctx):
        if ctx.phase == "":
            for i, kind in enumerate(("safe", "keyed", "unsafe", "unsafe_rec")):
                ctx.spawn(kind, {"n": 100 + i}, idem_key=f"fan-{i}")
            return Wait("gather", {"spawned": 4})
        children = await ctx.children()
        return Done({c.kind: c.state for c in children})


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("ledger")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--drain", type=float, default=10.0)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--crash-window", type=float, default=120.0)
    args = parser.parse_args()
    Counted.ledger = args.ledger
    Counted.slow = args.slow
    store = await open_store(args.url)
    registry = Registry(SafeCount(), KeyedCount(), UnsafeCount(), UnsafeReconciled(), Fanout())
    runner = Runner(store, registry, RunnerOptions(
        concurrency=args.concurrency, lease_seconds=5, poll_seconds=0.05,
        crash_window_seconds=args.crash_window, crash_limit=5, suspect_crashes=2))
    await runner.recover(steal_all=True)
    loop = asyncio.get_running_loop()
    drained = asyncio.Event()

    async def on_term():
        await runner.drain(args.drain)
        drained.set()

    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(on_term()))
    print("ready", flush=True)
    await runner.run(until_idle=not args.forever)
    if runner.stopping:
        await drained.wait()
    await store.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
