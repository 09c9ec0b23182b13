"""A Slack connector running in-process against the fake Slack: the real wiring
(`bot.app.wiring.wire`), a real runner, a store, and a model (scripted or the fake LLM
server) plugged in. Events go to it over real HTTP (HTTP mode) or the fake Socket Mode server."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import httpx

from bot.app.config import build_config
from bot.app.restore import RECONCILE_HOURS
from bot.app.wiring import wire
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Request, Response
from bot.runtime import RunnerOptions
from bot.tools import ToolBox, builtin_tools
from store import Store
from tests.fakes.slack_events import SIGNING_SECRET, deliver
from tests.fakes.slack_server import APP_TOKEN, BOT_TOKEN, FakeSlack

ALICE, BOB, MALLORY = "U0ALICE", "U0BOB", "U0MALLORY"  # the people of the tests' workspace

ENV = {"SLACK_BOT_TOKEN": BOT_TOKEN, "SLACK_APP_TOKEN": APP_TOKEN,
       "SLACK_SIGNING_SECRET": SIGNING_SECRET}
OPTIONS = RunnerOptions(concurrency=8, lease_seconds=5, retry_base_seconds=0.05,
                        retry_max_seconds=0.1, poll_seconds=0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def last_user_text(request: Request) -> str:
    return next((m.content for m in reversed(request.messages) if m.role == "user"), "")


def echo_model(**kwargs: Any) -> ScriptedModel:
    """Answers "echo: <the last user message>"."""
    return ScriptedModel(lambda r: Response(text=f"echo: {last_user_text(r)}"), **kwargs)


class SlackRig:
    def __init__(self, store: Store, home: Path, slack: FakeSlack, client: Any = None,
                 *, tools: list | None = None, run_tasks: bool = True,
                 options: RunnerOptions = OPTIONS, agent: dict | None = None,
                 restored: bool = False, **slack_config: Any):
        """`tools`: the agent's tools (default: the built-ins); `run_tasks=False` leaves the
        runner off until `start_runner()` (events are taken in, nothing is answered);
        `options`: the runner's (attempt limits, backoff); `agent`: the `[agent]` section
        (its timezone, say); `restored`: a home restored from a backup, whose deliveries ask
        the channel first for an hour, marked before anything runs, as bot/app/wiring.py
        does."""
        self.store = store
        self.slack = slack
        self.port = free_port()
        section = {"enabled": True, "mode": "http", "http_port": self.port,
                   "api_base_url": slack.url, "allowed_users": ["U0ALICE"],
                   "stream_update_seconds": 0.2, **slack_config}
        self.config = build_config({"slack": section, "agent": agent or {}, "runtime": {
            "retry_base_seconds": 0.05, "retry_max_seconds": 0.1}}, home=home, env=ENV)
        self.client = client or echo_model()
        self.http = httpx.AsyncClient(timeout=30)
        self.app = wire(self.config, store, self.client, self.http,
                        toolbox=ToolBox(*(builtin_tools() if tools is None else tools)),
                        options=options)
        self.deps, self.runner = self.app.deps, self.app.runner
        if restored:
            self.deps.reconcile_until = time.time() + RECONCILE_HOURS * 3600
        [self.connector] = self.app.connectors
        self._serving: asyncio.Task | None = None
        self._run_tasks = run_tasks

    @property
    def events_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"

    async def __aenter__(self) -> SlackRig:
        if self._run_tasks:
            self.start_runner()
        await self.connector.start()
        return self

    def start_runner(self) -> None:
        assert self._serving is None, "the runner is running already"
        self._serving = asyncio.create_task(self.runner.run())

    async def __aexit__(self, *exc: object) -> None:
        await self.connector.stop()
        await self.runner.drain(5)
        if self._serving is not None:
            await self._serving
        await self.http.aclose()

    async def send(self, body: dict, **kwargs: Any) -> tuple[int, float]:
        return await deliver(self.http, self.events_url, body, **kwargs)

    def _idle(self) -> bool:
        return self.connector.inbox.lanes.busy == 0 and self.connector.clicks.busy == 0

    async def settle(self, within: float = 20.0) -> None:
        """Wait until every event is processed and every task has finished."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self._idle() and not await self.store.list_tasks(active=True, limit=1):
                await asyncio.sleep(0.05)
                if self._idle() and not await self.store.list_tasks(active=True, limit=1):
                    return
            await asyncio.sleep(0.05)
        active = await self.store.list_tasks(active=True, limit=20)
        raise AssertionError(f"not settled: lanes {self.connector.inbox.lanes.busy}, "
                             f"tasks {[(t.kind, t.state, t.phase) for t in active]}")
