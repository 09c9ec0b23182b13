"""The agent's runtime in-process for tool tests: the real wiring (`bot.app.wiring.wire`)
with a scripted model, the built-in tools plus any others, and the test's store plugged in."""

import asyncio
from contextlib import asynccontextmanager

import httpx

from bot.agent.inbox import submit_message
from bot.app.config import build_config
from bot.app.wiring import wire
from bot.runtime import RunnerOptions
from bot.tools import Tool, ToolBox, builtin_tools

RIG_OPTIONS = RunnerOptions(concurrency=4, lease_seconds=5, retry_base_seconds=0.01,
                            retry_max_seconds=0.02, poll_seconds=0.02)


class Rig:
    """The agent's runtime in-process: a scripted model, the built-in tools and `extra`
    ones, the real task definitions and a runner."""

    def __init__(self, store, tmp_path, model, *extra: Tool, config: dict | None = None):
        self.store = store
        self.http = httpx.AsyncClient()
        config = build_config({"runtime": {"retry_base_seconds": 0.01,
                                           "retry_max_seconds": 0.02}, **(config or {})},
                              home=tmp_path)
        self.app = wire(config, store, model, self.http,
                        toolbox=ToolBox(*builtin_tools(), *extra), options=RIG_OPTIONS)
        self.deps, self.runner = self.app.deps, self.app.runner
        self.registry = self.runner.registry

    async def say(self, text: str, session: str = "cli:rig", owner: str | None = None) -> str:
        accepted = await submit_message(self.store, channel="cli", external_ids=[text],
                                        conversation_key=session, text=text, author="you",
                                        owner=owner)
        return accepted.turn_id

    async def run(self) -> None:
        await asyncio.wait_for(self.runner.run(until_idle=True), 30)


@asynccontextmanager
async def rig_factory(store, tmp_path):
    """`make(model, *extra_tools, config=...) -> Rig`; their HTTP clients are closed at the
    end. `config`: sections of the config to set (`{"limits": {...}}`)."""
    made: list[Rig] = []

    def make(model, *extra: Tool, config: dict | None = None) -> Rig:
        made.append(Rig(store, tmp_path, model, *extra, config=config))
        return made[-1]

    try:
        yield make
    finally:
        for rig in made:
            await rig.http.aclose()
