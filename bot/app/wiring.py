"""Application wiring: config -> store -> LLM client, tools, channels -> task definitions
-> runner. Connectors plug in here (never into the core) as they arrive.

`wire` puts the parts together and does no I/O; `open_app` opens the parts the config
names (the store, the HTTP client, the model client, the connectors), each unless it is
handed one, and wires them. Tests use the same two with fakes plugged in (a scripted model,
a channel of their own, a connector with test TLS), the way an HTTP client takes a
transport: nothing rebuilt by hand."""

import asyncio
import functools
import importlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import httpx

from bot.agent import capacity
from bot.agent.approval import Approval
from bot.agent.compact import Compact
from bot.agent.deliver import Deliver
from bot.agent.deps import AgentDeps
from bot.agent.llm_call import LLMCall
from bot.agent.tool_call import ToolCallTask
from bot.agent.turn import Turn
from bot.agent_port import LocalPort
from bot.app import allocator, restore, taskdump
from bot.app.backup_schedule import keep_backing_up
from bot.app.config import StewardConfig as Config
from bot.app.home_lock import HomeBusy, HomeLock
from bot.app.opened import opened_store
from bot.app.systemd import Notifier
from bot.channels import Channel, Connector
from bot.config import unset_secrets
from bot.llm.factory import make_client
from bot.memory import embeddings as _embeddings
from bot.memory.embedding_task import EmbedEntries, ensure_embedding
from bot.memory.facts import FACT_TOOLS
from bot.memory.search import search_history
from bot.port import Host
from bot.runtime import Registry, Runner, RunnerOptions
from bot.runtime.lock import RunnerLock
from bot.runtime.supervision import Health, describe
from bot.scheduler.loop import Scheduler
from bot.scheduler.tool import schedule as schedule_tool
from bot.tools import ToolBox, builtin_tools
from bot.tools.mcp.servers import McpServers
from bot.tools.mcp.tools import mcp_tools
from connectors.terminal import TerminalChannel
from store import Store

log = logging.getLogger(__name__)

# How long a command that ends by itself (`ask`, `resume`, `chat`) waits for a store that is
# away before it gives up with the reason; `steward run` waits as long as it takes.
OUTAGE_PATIENCE = 120.0


def runner_options(config: Config) -> RunnerOptions:
    r = config.runtime
    return RunnerOptions(concurrency=r.concurrency, lease_seconds=r.lease_seconds,
                         max_attempts=r.max_attempts, outage_attempts=r.outage_attempts,
                         crash_limit=r.crash_limit,
                         crash_window_seconds=r.crash_window_seconds,
                         retry_base_seconds=r.retry_base_seconds,
                         retry_max_seconds=r.retry_max_seconds, poll_seconds=0.5)


# Connectors by config section, imported only when enabled.
CONNECTORS = {"slack": "connectors.slack.connector:SlackConnector",
              "email": "connectors.email.connector:EmailConnector"}


# Builds a connector for the process, given the host (its section is the factory's to know).
ConnectorFactory = Callable[[Host], Connector]


def host_of(config: Config, deps: AgentDeps) -> Host:
    """What every connector of this process is handed besides its section."""
    return Host(port=LocalPort(deps), home=config.home, agent_name=config.agent.name,
                secret=config.secret)


def enabled_connectors(config: Config) -> list[ConnectorFactory]:
    """A factory per enabled connector, its section bound. One whose secrets are not set is
    left out: only a command that does not serve it (`ask`, `chat`) starts without them
    (bot/app/commands.py NEEDS); its deliveries wait for `run`."""
    factories: list[ConnectorFactory] = []
    for section, target in CONNECTORS.items():
        if not getattr(config, section).enabled:
            continue
        if unset := unset_secrets(config, (section,)):
            log.info("%s left out of this process: %s", section, unset[0][1])
            continue
        module, _, name = target.partition(":")
        connector = getattr(importlib.import_module(module), name)
        factories.append(functools.partial(connector, getattr(config, section)))
    return factories


def build_connectors(config: Config, deps: AgentDeps,
                     factories: Sequence[ConnectorFactory] | None = None) -> list[Connector]:
    """The connectors `factories` build (default: the enabled ones), each handed this
    process's `Host` and registered as its deliveries' channel."""
    host = host_of(config, deps)
    built = [make(host) for make in (enabled_connectors(config) if factories is None
                                     else factories)]
    for connector in built:
        deps.channels[connector.name] = connector.channel
    return built


def build_registry(deps: AgentDeps) -> Registry:
    """Every task kind this build knows. A kind missing here leaves its tasks blocked."""
    return Registry(Turn(deps), LLMCall(deps), ToolCallTask(deps), Deliver(deps),
                    Compact(deps), Approval(deps.store, deps.channels),
                    EmbedEntries(deps.store, _embeddings.attached(deps.store)))


async def build_toolbox(config: Config, mcp: McpServers | None = None) -> ToolBox:
    toolbox = ToolBox()
    for t in [*builtin_tools(), schedule_tool, *FACT_TOOLS, search_history]:
        toolbox.register(t)
    for module in config.agent.tool_modules:
        await asyncio.to_thread(toolbox.load_module, module)  # imports read files
    for t in mcp_tools(mcp) if mcp else []:
        toolbox.register(t)
        toolbox.custom.add(t.name)  # the owner's tools, not ours: the same approval rules
    return toolbox


@dataclass
class App:
    config: Config
    store: Store
    deps: AgentDeps
    runner: Runner
    banner: str | None  # one line for the user when no real model is configured
    connectors: list[Connector]  # enabled ones; started by `steward run`
    mcp: McpServers  # the configured MCP servers; connected on first use, or by `run`
    health: Health  # the long-lived loops' state (home/health.json while `run` serves)


def wire(config: Config, store: Store, client, http: httpx.AsyncClient, *,
         toolbox: ToolBox, channels: Mapping[str, Channel] | None = None,
         connectors: Sequence[ConnectorFactory] | None = None,
         options: RunnerOptions | None = None, mcp: McpServers | None = None,
         banner: str | None = None) -> App:
    """The agent from its parts, nothing opened or started: the terminal's channel, then
    `channels` (by name), then the connectors (those `connectors` builds, else the
    enabled ones), every task kind and a runner (`options`, else the config's)."""
    deps = AgentDeps(store=store, config=config, client=client, toolbox=toolbox, http=http)
    deps.channels["cli"] = TerminalChannel(deps.events)
    deps.channels.update(channels or {})
    built = build_connectors(config, deps, connectors)
    health = Health(config.home)
    runner = Runner(store, build_registry(deps), options or runner_options(config),
                    health=health.loop("runner", give_up_after=OUTAGE_PATIENCE))
    health.loops[runner.commits.name] = runner.commits
    deps.wake = runner.wake
    return App(config, store, deps, runner, banner, built,
               mcp or McpServers(config.mcp, config.secret), health)


@asynccontextmanager
async def open_app(config: Config, *, store: Store | None = None, client=None,
                   channels: Mapping[str, Channel] | None = None,
                   connectors: Sequence[ConnectorFactory] | None = None,
                   options: RunnerOptions | None = None):
    """The whole agent in this process, with what the last process left already resumed.
    Each part not handed in is opened from the config: the store (`store`, closed here
    only if opened here), the model client (`client`), the connectors (`connectors`:
    factories of a `Host`); `channels` are added to the terminal's; `options`: the
    runner's (default: the config's)."""
    async with AsyncExitStack() as stack:
        if store is None:
            store = await stack.enter_async_context(opened_store(config))
        http = await stack.enter_async_context(httpx.AsyncClient(
            timeout=httpx.Timeout(60.0, connect=10.0)))
        banner = None
        if client is None:
            client, banner = await make_client(config.llm, env=os.environ, http=http)
        # Before the registry: the embedding task, the search tool and the recall use it.
        embedder = _embeddings.make(config, http)
        _embeddings.attach(store, embedder)
        mcp = McpServers(config.mcp, config.secret)
        stack.push_async_callback(mcp.close)
        toolbox = await build_toolbox(config, mcp)
        # The window the model's server really has (it may be smaller than configured).
        await capacity.learn_at_start(store, config, client, http)
        fallbacks = [((await make_client(fallback, env=os.environ, http=http,
                                         probe_ollama=False))[0], fallback)
                     for fallback in config.llm.fallbacks]  # each names its provider
        restored = await asyncio.to_thread(restore.on_start, config.home)
        if restored is not None:
            log.warning("this home was restored from a backup taken %s: catching up, and "
                        "every delivery asks its channel first until %s",
                        time.strftime("%Y-%m-%d %H:%M", time.localtime(restored.taken_at)),
                        time.strftime("%H:%M", time.localtime(restored.reconcile_until)))
            restore.widen_catchup(config, restored)  # before the connectors read it
        app = wire(config, store, client, http, toolbox=toolbox, channels=channels,
                   connectors=connectors, options=options, mcp=mcp, banner=banner)
        app.deps.fallbacks.extend(fallbacks)
        if restored is not None:
            app.deps.reconcile_until = restored.reconcile_until
        lock = RunnerLock(config.home / "runner.lock")
        alone = store.single_node and await asyncio.to_thread(lock.try_acquire)
        stack.callback(lock.release)
        counts = await app.runner.recover(steal_all=alone)
        log.info("resumed %(resumed)d running and %(unblocked)d blocked tasks", counts)
        await ensure_embedding(store, embedder)
        yield app


def _print_aside(message) -> None:
    print(f"[{message.conversation_key}] {message.text}", flush=True)


async def run_forever(config: Config) -> int:
    """`steward run`: resume, then serve until SIGTERM/SIGINT, then drain and exit 0. If one
    of its loops ends by itself (an error that is not an outage to wait out), stop and exit
    1: the service manager starts a fresh process, never one left up with nothing working.
    A home another `run` serves is refused at once, with that one's pid (exit 1: a service
    refused so tries again, and takes over once the other has stopped)."""
    lock = HomeLock(config.home)
    try:
        await asyncio.to_thread(lock.acquire)
    except HomeBusy as exc:
        print(f"steward: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        return await _serve(config)
    finally:
        lock.release()


async def _serve(config: Config) -> int:
    allocator.configure()  # cap malloc arenas before the first thread (bot/app/allocator.py)
    notifier = Notifier()
    async with open_app(config) as app:
        # What reaches the terminal with no `ask` or `chat` there (a reminder): on stdout.
        app.deps.channels["cli"].aside = _print_aside
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        taskdump.install(loop)
        app.runner.health.give_up_after = None  # a service waits as long as it takes
        app.runner.health.on_beat = notifier.beat  # the watchdog hears the claim loop
        loops = {"runner": asyncio.create_task(app.runner.run(), name="runner"),
                 "memory trim": asyncio.create_task(allocator.trim_periodically()),
                 "health": asyncio.create_task(app.health.publish())}
        # Interrupted tasks were resumed when the app opened; now re-arm the schedules
        # (its first pass catches up what was missed while Steward was down).
        scheduler = Scheduler(app.deps, health=app.health.loop("scheduler"))
        loops["scheduler"] = asyncio.create_task(scheduler.run(), name="scheduler")
        if config.backup.every_seconds:  # [backup] every: bot/app/backup_schedule.py
            loops["backup"] = asyncio.create_task(
                keep_backing_up(config, app.health.loop("backup")), name="backup")
        app.mcp.start()  # kept up from now on, restarted when they die
        for connector in app.connectors:
            await connector.start()
            app.health.connected[connector.name] = lambda c=connector: c.up
        if app.banner:
            print(app.banner, file=sys.stderr, flush=True)
        names = ", ".join(c.name if c.up else f"{c.name} (connecting)"
                          for c in app.connectors) or "none"
        print(f"steward: running on {app.store.dialect} ({config.home}); connectors: {names}; "
              "Ctrl-C to stop", flush=True)
        notifier.ready()
        signalled = asyncio.create_task(stopped.wait())
        await asyncio.wait([signalled, *loops.values()], return_when=asyncio.FIRST_COMPLETED)
        died = {name: t for name, t in loops.items() if t.done()}
        for name, task in died.items():
            exc = None if task.cancelled() else task.exception()
            log.critical("the %s loop ended%s; stopping so that a fresh process takes over",
                         name, f": {describe(exc)}" if exc else "", exc_info=exc)
        signalled.cancel()
        notifier.stopping()
        for name in ("memory trim", "health", "backup"):  # these never end by themselves
            if name in loops:
                loops[name].cancel()
        # Each step of the way out is logged: a stop that takes long says where it waits.
        for connector in app.connectors:
            log.info("stopping: the %s connector", connector.name)
            await connector.stop()
        scheduler.stop()
        await asyncio.gather(loops["scheduler"], return_exceptions=True)
        log.info("stopping: finishing what runs (at most %.0f s)", config.runtime.drain_seconds)
        finished = await app.runner.drain(config.runtime.drain_seconds)
        await asyncio.gather(*loops.values(), return_exceptions=True)
        log.info("stopping: closing the store")
        app.health.remove()
        if not finished:
            log.warning("drain timed out; unfinished phases resume on the next start")
    notifier.close()
    return 1 if died else 0
