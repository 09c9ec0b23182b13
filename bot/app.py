"""Application wiring: config -> store -> LLM client, tools, channels -> task definitions
-> runner. Connectors plug in here (never into the core) as they arrive."""

import asyncio
import importlib
import logging
import os
import signal
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from bot.agent.deliver import Deliver
from bot.agent.deps import AgentDeps
from bot.agent.llm_call import LLMCall
from bot.agent.tool_call import ToolCallTask
from bot.agent.turn import Turn
from bot.config import Config
from bot.llm.factory import make_client
from bot.memory.compaction import Compact
from bot.memory.facts import FACT_TOOLS
from bot.memory.search import search_history
from bot.runtime import Registry, Runner, RunnerOptions
from bot.runtime.lock import RunnerLock
from bot.scheduler.loop import Scheduler
from bot.scheduler.tool import schedule as schedule_tool
from bot.tools import ToolBox, builtin_tools
from connectors.terminal import TerminalChannel
from store import Store, open_store

log = logging.getLogger(__name__)


def runner_options(config: Config) -> RunnerOptions:
    r = config.runtime
    return RunnerOptions(concurrency=r.concurrency, lease_seconds=r.lease_seconds,
                         max_attempts=r.max_attempts, outage_attempts=r.outage_attempts,
                         retry_base_seconds=r.retry_base_seconds,
                         retry_max_seconds=r.retry_max_seconds, poll_seconds=0.5)


# Connectors by config section, imported only when enabled.
CONNECTORS = {"slack": "connectors.slack:SlackConnector",
              "email": "connectors.email:EmailConnector"}


def build_connectors(config: Config, deps: AgentDeps) -> list:
    """The enabled connectors, each registered as its deliveries' channel."""
    built = []
    for section, target in CONNECTORS.items():
        if not getattr(config, section).enabled:
            continue
        module, _, name = target.partition(":")
        connector = getattr(importlib.import_module(module), name)(config, deps)
        deps.channels[connector.name] = connector.channel
        built.append(connector)
    return built


def build_registry(deps: AgentDeps) -> Registry:
    """Every task kind this build knows. A kind missing here leaves its tasks blocked."""
    return Registry(Turn(deps), LLMCall(deps), ToolCallTask(deps), Deliver(deps),
                    Compact(deps))


async def build_toolbox(config: Config) -> ToolBox:
    toolbox = ToolBox()
    for t in [*builtin_tools(), schedule_tool, *FACT_TOOLS, search_history]:
        toolbox.register(t)
    for module in config.agent.tool_modules:
        await asyncio.to_thread(toolbox.load_module, module)  # imports read files
    return toolbox


@dataclass
class App:
    config: Config
    store: Store
    deps: AgentDeps
    runner: Runner
    banner: str | None  # one line for the user when no real model is configured
    connectors: list  # enabled ones; started by `steward run`


@asynccontextmanager
async def opened_store(config: Config):
    store = await open_store(config.store_url)
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def open_app(config: Config):
    """The whole agent in this process, with what the last process left already resumed."""
    async with opened_store(config) as store, httpx.AsyncClient(
            timeout=httpx.Timeout(60.0, connect=10.0)) as http:
        client, banner = await make_client(config.llm, env=os.environ, http=http)
        deps = AgentDeps(store=store, config=config, client=client,
                         toolbox=await build_toolbox(config), http=http)
        deps.channels["cli"] = TerminalChannel(deps.events)
        connectors = build_connectors(config, deps)
        runner = Runner(store, build_registry(deps), runner_options(config))
        deps.wake = runner.wake
        lock = RunnerLock(config.home / "runner.lock")
        alone = store.single_node and await asyncio.to_thread(lock.try_acquire)
        try:
            counts = await runner.recover(steal_all=alone)
            log.info("resumed %(resumed)d running and %(unblocked)d blocked tasks", counts)
            yield App(config, store, deps, runner, banner, connectors)
        finally:
            lock.release()


async def run_forever(config: Config) -> int:
    """`steward run`: resume, then serve until SIGTERM/SIGINT, then drain and exit 0."""
    async with open_app(config) as app:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        serving = asyncio.create_task(app.runner.run())
        # Interrupted tasks were resumed when the app opened; now re-arm the schedules
        # (its first pass catches up what was missed while Steward was down).
        scheduler = Scheduler(app.deps)
        timing = asyncio.create_task(scheduler.run())
        for connector in app.connectors:
            await connector.start()
        if app.banner:
            print(app.banner, file=sys.stderr, flush=True)
        names = ", ".join(c.name for c in app.connectors) or "none"
        print(f"steward: running on {app.store.dialect} ({config.home}); connectors: {names}; "
              "Ctrl-C to stop", flush=True)
        await stopped.wait()
        for connector in app.connectors:
            await connector.stop()
        scheduler.stop()
        await timing
        finished = await app.runner.drain(config.runtime.drain_seconds)
        await serving
        if not finished:
            log.warning("drain timed out; unfinished phases resume on the next start")
    return 0
