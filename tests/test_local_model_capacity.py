"""A model on the owner's own box: the context size learned from the server (llama.cpp
/props, Ollama /api/show, a /models entry, an overflow error's own words), stored, and used
by the window and compaction; compaction that works at 4k and 8k windows.

The servers are `tests/fakes/local_model_props.py`: what llama.cpp and Ollama answer,
replayed on 127.0.0.1, with their real behaviour for a prompt that does not fit."""

import asyncio
import contextlib

import httpx

from bot.agent.deps import AgentDeps
from bot.agent.inbox import submit_message
from bot.app.config import build_config
from bot.app.wiring import build_registry, build_toolbox
from bot.llm.openai import OpenAIClient
from bot.runtime import Runner, RunnerOptions
from connectors.terminal import TerminalChannel
from store import DONE, open_store
from tests.fakes.local_model_props import LocalModelServer
from tests.test_cli import steward, steward_env

OPTIONS = RunnerOptions(concurrency=4, retry_base_seconds=0.01, retry_max_seconds=0.02,
                        poll_seconds=0.02)


def llm_section(server: LocalModelServer, **more) -> dict:
    return {"llm": {"provider": "openai", "base_url": f"{server.url}/v1",
                    "model": server.model, **more},
            "runtime": {"max_attempts": 2, "retry_base_seconds": 0.01,
                        "retry_max_seconds": 0.02}}


class Agent:
    """The agent in this process as `steward run` builds it (the default tools, the real
    client and task definitions) against a local model server, on SQLite."""

    def __init__(self, store, config, http):
        self.store, self.config, self.http = store, config, http
        self.n = 0

    async def start(self):
        client = OpenAIClient(self.http, base_url=self.config.llm.base_url, api_key=None,
                              model=self.config.llm.model)
        self.deps = AgentDeps(store=self.store, config=self.config, client=client,
                              toolbox=await build_toolbox(self.config), http=self.http)
        self.deps.channels["cli"] = TerminalChannel(self.deps.events)
        self.runner = Runner(self.store, build_registry(self.deps), OPTIONS)
        return self

    async def say(self, text: str, session: str = "cli:local"):
        self.n += 1
        accepted = await submit_message(self.store, channel="cli",
                                        external_ids=[f"{session}:{self.n}"],
                                        conversation_key=session, text=text)
        await asyncio.wait_for(self.runner.run(until_idle=True), 120)
        return await self.store.get_task(accepted.turn_id)

    async def tasks(self, kind: str) -> list:
        return await self.store.list_tasks(kind=kind, limit=10_000)

    async def entries(self, kind: str, session: str = "cli:local") -> list:
        conv = await self.store.get_conversation(session)
        found, after = [], 0
        while page := await self.store.entries_page(conv.id, after=after, limit=500):
            found += [e for e in page if e.kind == kind]
            after = page[-1].seq
        return found


@contextlib.asynccontextmanager
async def agent(tmp_path, server, **llm):
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'steward.db'}")
    try:
        async with httpx.AsyncClient() as http:
            config = build_config(llm_section(server, **llm), home=tmp_path)
            yield await Agent(store, config, http).start()
    finally:
        await store.close()


def answered(task) -> bool:
    return task.state == DONE and not (task.result or {}).get("error") and \
        "trouble" not in str(task.result)


# -- the findings -----------------------------------------------------------------------


async def test_a_2048_token_server_behind_the_default_128000_keeps_answering(tmp_path):
    """Finding: with `context_window = 128000` (the default) against a 2,048-token
    llama.cpp, one long paste and afterwards every message overflows, and `steward
    compact` says "nothing old enough". Learned from /props, the window is the server's."""
    home = tmp_path / "home"
    home.mkdir()
    with LocalModelServer("llamacpp", n_ctx=2048) as server:
        (home / "config.toml").write_text(
            f'[llm]\nprovider = "openai"\nbase_url = "{server.url}/v1"\n'
            f'model = "{server.model}"\n')
        env = steward_env(home)
        await steward(home, "ask", "please keep this: " + "lorem ipsum dolor " * 600,
                      env=env)
        for n in range(3):
            code, out, err = await steward(home, "ask", f"and now a short question {n}",
                                           env=env)
            assert (code, out.strip()) == (0, "ok"), (out, err)
        # The paste was summarised on the way (the window was full), so an explicit
        # compaction now finds the rest too recent; either way it works.
        assert [c.summary for c in server.calls].count(True) >= 1
        code, out, err = await steward(home, "compact", "cli:default", env=env)
        assert code == 0 and out.startswith(("compacted", "nothing to compact")), (out, err)
        assert server.overflows == 0
        assert all(c.prompt_tokens + c.max_tokens <= 2048 for c in server.calls)


async def test_at_an_8192_window_compaction_is_not_a_task_per_turn(tmp_path):
    """Finding: at `context_window = 8192` a compaction task started on every turn (5 in
    5 turns) and never wrote a summary. Five short turns need none; a long conversation
    gets summaries, a few compactions, and no request over the window."""
    with LocalModelServer("llamacpp", n_ctx=8192) as server:
        async with agent(tmp_path, server, context_window=8192) as a:
            for n in range(5):
                assert answered(await a.say(f"short message {n}"))
            assert await a.tasks("compact") == []
            for n in range(60):
                assert answered(await a.say(f"message {n}: " + "some words here " * 20))
            compactions = await a.tasks("compact")
            summaries = await a.entries("compaction")
            assert summaries and all(t.state == DONE for t in compactions)
            assert len(compactions) <= 65 // 5, len(compactions)
            assert len(summaries) >= len(compactions) - 1
            assert server.overflows == 0
            assert all(c.prompt_tokens + c.max_tokens <= 8192 for c in server.calls)
