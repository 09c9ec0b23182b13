"""Application wiring: config -> store -> task definitions -> runner. Connectors plug in
here (never into the core) as they arrive."""

import asyncio
import logging
import signal
from contextlib import asynccontextmanager

from bot.config import Config
from bot.runtime import Registry, Runner, RunnerOptions
from bot.runtime.lock import RunnerLock
from store import Store, open_store

log = logging.getLogger(__name__)


def build_registry(config: Config) -> Registry:
    """Every task kind this build knows. A kind missing here leaves its tasks blocked."""
    return Registry()


def runner_options(config: Config) -> RunnerOptions:
    r = config.runtime
    return RunnerOptions(concurrency=r.concurrency, lease_seconds=r.lease_seconds,
                         max_attempts=r.max_attempts, retry_base_seconds=r.retry_base_seconds,
                         retry_max_seconds=r.retry_max_seconds)


@asynccontextmanager
async def opened_store(config: Config):
    store = await open_store(config.store_url)
    try:
        yield store
    finally:
        await store.close()


async def start_runner(config: Config, store: Store) -> tuple[Runner, RunnerLock]:
    """A runner that has already resumed what the last process left behind."""
    runner = Runner(store, build_registry(config), runner_options(config))
    lock = RunnerLock(config.home / "runner.lock")
    alone = store.single_node and await asyncio.to_thread(lock.try_acquire)
    counts = await runner.recover(steal_all=alone)
    log.info("resumed %(resumed)d running and %(unblocked)d blocked tasks", counts)
    return runner, lock


async def run_forever(config: Config) -> int:
    """`steward run`: resume, then serve until SIGTERM/SIGINT, then drain and exit 0."""
    async with opened_store(config) as store:
        runner, lock = await start_runner(config, store)
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        serving = asyncio.create_task(runner.run())
        print(f"steward: running on {store.dialect} ({config.home}); "
              "no connectors enabled yet; Ctrl-C to stop", flush=True)
        await stopped.wait()
        finished = await runner.drain(config.runtime.drain_seconds)
        await serving
        lock.release()
        if not finished:
            log.warning("drain timed out; unfinished phases resume on the next start")
    return 0


async def resume(config: Config) -> int:
    """`steward resume`: finish everything that is ready or interrupted, then exit."""
    async with opened_store(config) as store:
        runner, lock = await start_runner(config, store)
        await runner.run(until_idle=True)
        lock.release()
        counts = await store.count_tasks()
    print("tasks: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    return 0
