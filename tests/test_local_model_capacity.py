"""A model on the owner's own box: the context size learned from the server (llama.cpp
/props, Ollama /api/show, a /models entry, an overflow error's own words), stored, and used
by the window and compaction; compaction that works at 4k and 8k windows.

The servers are `tests/fakes/local_model_props.py`: what llama.cpp and Ollama answer,
replayed on 127.0.0.1, with their real behaviour for a prompt that does not fit."""

import asyncio
import contextlib

import httpx
import pytest

from bot.agent.inbox import submit_message
from bot.app.config import ConfigError, build_config
from bot.app.wiring import build_toolbox, wire
from bot.llm.openai import OpenAIClient
from bot.runtime import RunnerOptions
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
        app = wire(self.config, self.store, client, self.http,
                   toolbox=await build_toolbox(self.config), options=OPTIONS)
        self.deps, self.runner = app.deps, app.runner
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


async def test_a_4096_token_server_holds_a_200_turn_conversation(tmp_path):
    """The target: a 4k-context llama.cpp (learned from /props, with the default
    128000 configured), the default tools offered, 200 turns: every one answered, summaries
    written by a small number of compactions, and no request over the window."""
    from bot.agent.capacity import learn_at_start

    with LocalModelServer("llamacpp", n_ctx=4096,
                          answer=lambda body: "noted, " + "fine words " * 8) as server:
        async with agent(tmp_path, server) as a:
            await learn_at_start(a.store, a.config, a.deps.client, a.http)
            assert a.config.llm.window == 4096
            for n in range(200):
                said = f"turn {n}: " + " ".join(f"w{n}x{k}" for k in range(12 + n % 20))
                assert answered(await a.say(said)), n
            compactions = await a.tasks("compact")
            summaries = await a.entries("compaction")
    turns = [c for c in server.calls if not c.summary]
    assert len(turns) == 200 and all(c.tools for c in turns)  # the tools fit, and stayed
    assert server.overflows == 0
    assert all(c.prompt_tokens + c.max_tokens <= 4096 for c in server.calls)
    assert all(t.state == DONE for t in compactions)
    assert len(summaries) >= 5
    assert len(compactions) <= 200 // 5, len(compactions)
    assert sum(1 for t in compactions if "skipped" in (t.result or {})) <= 2


async def test_the_overflow_error_teaches_the_window_and_it_is_kept(tmp_path):
    """A server that does not say its size (no /props, no size in /models) answers an
    overflow with it: the turn is answered after all (compacted, the request made for
    that size), and the size is stored for the next start."""
    from bot.agent import capacity

    with LocalModelServer("llamacpp", n_ctx=3000, newer=False) as server:
        server.props = lambda: {}  # a server that does not say
        async with agent(tmp_path, server) as a:
            for n in range(12):
                assert answered(await a.say(f"message {n} " + "filler text " * 80)), n
            assert server.overflows == 1
            assert a.config.llm.window == 3000
            key = capacity.key_of(a.deps.client)
            assert (await capacity.stored(a.store, key))["context_tokens"] == 3000
            fresh = build_config(llm_section(server), home=tmp_path)
            await capacity.learn_at_start(a.store, fresh, a.deps.client, a.http)
            assert fresh.llm.window == 3000  # /models gives 32768 trained: the error wins


# -- what the servers say ---------------------------------------------------------------


async def test_discovery_reads_llamacpp_and_ollama_as_they_answer():
    from bot.llm.discovery import discover

    async with httpx.AsyncClient() as http:
        with LocalModelServer("llamacpp", n_ctx=2048) as server:
            facts = await discover(http, f"{server.url}/v1", "whatever", "compatible")
            assert (facts.context_tokens, facts.tools) == (2048, True)
            assert facts.source == "llama.cpp /props" and facts.models == (server.model,)
        with LocalModelServer("llamacpp", n_ctx=8192, tools=False, newer=False) as server:
            facts = await discover(http, f"{server.url}/v1", server.model, "llamacpp")
            assert (facts.context_tokens, facts.tools) == (8192, False)  # older /props
        with LocalModelServer("ollama", n_ctx=8192, n_ctx_train=131072) as server:
            facts = await discover(http, f"{server.url}/v1", server.model, "ollama")
            assert (facts.context_tokens, facts.tools, facts.source) == (
                8192, True, "Ollama /api/ps")
        with LocalModelServer("ollama", n_ctx_train=131072, num_ctx=16384, tools=False,
                              newer=False) as server:
            facts = await discover(http, f"{server.url}/v1", server.model, "compatible")
            assert (facts.context_tokens, facts.tools) == (16384, False)  # Modelfile num_ctx
        with LocalModelServer("ollama", n_ctx_train=131072, newer=False) as server:
            facts = await discover(http, f"{server.url}/v1", server.model, "ollama")
            assert facts.context_tokens == 4096  # Ollama's own default, not the 131072
        facts = await discover(http, "http://127.0.0.1:9/v1", "m", "compatible")
        assert not facts  # nothing answers: nothing learned


def test_the_words_of_overflow_errors_and_model_listings():
    from bot.llm.discovery import from_models, from_overflow

    llamacpp = ('{"error":{"code":400,"message":"request (4472 tokens) exceeds the available '
                'context size (2048 tokens), try increasing it","type":'
                '"exceed_context_size_error","n_prompt_tokens":4472,"n_ctx":2048}}')
    assert from_overflow(llamacpp) == 2048
    assert from_overflow("", "the request exceeds the available context size (4096 "
                             "tokens), try increasing it") == 4096
    assert from_overflow('{"error":{"message":"This model\'s maximum context length is '
                         '8192 tokens. However, you requested 9000 tokens"}}') == 8192
    assert from_overflow('{"error":"prompt is too long"}') is None
    vllm = {"data": [{"id": "Qwen/Qwen2.5-7B", "max_model_len": 32768}]}
    assert from_models(vllm, "Qwen/Qwen2.5-7B").context_tokens == 32768
    lmstudio = {"data": [{"id": "a", "context_length": 4096}, {"id": "b"}]}
    assert from_models(lmstudio, "a").context_tokens == 4096
    assert from_models(lmstudio, "b").context_tokens is None
    assert from_models(lmstudio, "c").models == ("a", "b")


def test_the_learned_window_only_lowers_the_configured_one(tmp_path):
    config = build_config({"llm": {"context_window": 8192}}, home=tmp_path)
    config.llm.learn(context_tokens=32768)
    assert config.llm.window == 8192 and config.llm.output_tokens == 8192 // 5
    config.llm.learn(context_tokens=2048)
    assert config.llm.window == 2048 and config.llm.output_tokens == 409
    default = build_config({}, home=tmp_path)
    assert (default.llm.window, default.llm.output_tokens) == (128000, 4096)
    chosen = build_config({"llm": {"max_output_tokens": 3000, "context_window": 4000}},
                          home=tmp_path)
    assert chosen.llm.output_tokens == 3000  # set in the file, and it still leaves room
    chosen.llm.learn(context_tokens=2048)  # chosen for a window that is not there
    assert chosen.llm.output_tokens == 409


# -- doctor ------------------------------------------------------------------------------


async def local_doctor(tmp_path, server, provider="llamacpp"):
    from tests.test_doctor import doctor

    home = tmp_path / f"home-{server.n_ctx}-{server.tools}"
    home.mkdir(mode=0o700)
    (home / "config.toml").write_text(
        f'[llm]\nprovider = "{provider}"\nbase_url = "{server.url}/v1"\n')
    _, rows, _ = await doctor(home)
    return rows["model"]


async def test_doctor_says_what_the_model_can_hold_and_do(tmp_path):
    with LocalModelServer("llamacpp", n_ctx=8192) as server:
        row = await local_doctor(tmp_path, server)
        assert row["status"] == "ok", row
        assert f"llamacpp {server.model}: first answer after" in row["detail"]
        assert "context 8,192 tokens (llama.cpp /props)" in row["detail"]
        assert "tools reach the model" in row["detail"]
    with LocalModelServer("llamacpp", n_ctx=8192, tools=False) as server:
        row = await local_doctor(tmp_path, server)
        assert row["status"] == "warn" and row["detail"].startswith(
            "this model's template drops tools: memory and reminders will not work"), row
        assert "--chat-template-file" in row["fix"]
    with LocalModelServer("ollama", n_ctx=2048) as server:
        row = await local_doctor(tmp_path, server, "ollama")
        assert row["status"] == "warn", row
        assert row["detail"].startswith("the window is too small for the tools")
        assert "context 2,048 tokens (Ollama /api/ps)" in row["detail"]
        assert "at least 4,096 tokens" in row["fix"]


async def test_tools_are_not_offered_to_a_template_that_drops_them(tmp_path):
    from bot.agent.capacity import learn_at_start

    with LocalModelServer("llamacpp", n_ctx=8192, tools=False) as server:
        async with agent(tmp_path, server) as a:
            await learn_at_start(a.store, a.config, a.deps.client, a.http)
            assert answered(await a.say("remember that I like tea"))
    assert [c.tools for c in server.calls] == [0]


# -- the provider names, the presets and init ----------------------------------------------


def test_every_provider_init_offers_is_one_the_config_accepts(tmp_path):
    from bot.app import cli, presets
    from bot.config import PROVIDERS

    assert set(cli.PROVIDERS) == set(presets.PROVIDERS) <= set(PROVIDERS)
    for name in presets.PROVIDERS:
        written, *_ = presets.PROVIDERS[name]
        section = {"provider": written} if written else {}
        if name == "compatible":
            section["base_url"] = "http://127.0.0.1:1234/v1"
        build_config({"llm": section}, home=tmp_path)  # raises if it does not load
    said = {name: build_config({"llm": {"provider": name, "base_url": "http://h/v1"}},
                               home=tmp_path).llm.provider for name in PROVIDERS}
    assert said["auto"] is None and said["demo"] == "scripted"
    assert said["ollama"] == "ollama" and said["llamacpp"] == "llamacpp"
    with pytest.raises(ConfigError, match="compatible.*base_url"):
        build_config({"llm": {"provider": "compatible"}}, home=tmp_path)


async def test_the_local_presets_find_their_server_and_model(tmp_path):
    from bot.llm import factory

    async with httpx.AsyncClient() as http:
        with LocalModelServer("llamacpp") as server:
            config = build_config({"llm": {"provider": "llamacpp",
                                           "base_url": f"{server.url}/v1"}}, home=tmp_path)
            client, _ = await factory.make_client(config.llm, env={}, http=http)
            assert (client.provider, client.model) == ("llamacpp", server.model)
        with LocalModelServer("ollama") as server:
            config = build_config({"llm": {"provider": "ollama",
                                           "base_url": f"{server.url}/v1"}}, home=tmp_path)
            client, _ = await factory.make_client(config.llm, env={}, http=http)
            assert (client.provider, client.model) == ("ollama", server.model)
    assert factory.LOCAL_BASE_URLS == {"ollama": "http://127.0.0.1:11434/v1",
                                       "llamacpp": "http://127.0.0.1:8080/v1"}


async def test_init_offers_a_running_llamacpp_with_its_context_size(tmp_path):
    from tests.test_init import loads, no_ollama, written

    home = tmp_path / "home"
    home.mkdir()
    with LocalModelServer("llamacpp", n_ctx=4096) as server:
        code, out, err = await steward(home, "init", "--yes", "--ollama-url", no_ollama(),
                                       "--llamacpp-url", server.url)
    assert code == 0, err
    config = loads(written(home))
    assert (config.llm.provider, config.llm.base_url) == ("llamacpp", f"{server.url}/v1")
    assert config.llm.model == server.model
    assert "4,096 tokens" in out


def test_a_server_on_this_machine_or_the_lan_is_asked_at_every_start():
    from bot.agent.capacity import nearby

    assert all(map(nearby, ["http://127.0.0.1:8080/v1", "http://localhost:11434/v1",
                            "http://192.168.1.5:8080/v1", "http://nas.local:8080/v1",
                            "http://[::1]:8080/v1"]))
    assert not nearby("https://openrouter.ai/api/v1")  # asked once, then stored
