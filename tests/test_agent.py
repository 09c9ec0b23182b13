"""Turns in-process on both backends: the loop, follow-ups, the usage ledger, errors the
user must hear about, and the context the model receives."""

import asyncio

import httpx
import pytest

from bot.agent.context import build_request, to_messages
from bot.agent.inbox import submit_message
from bot.agent.llm_call import LLMCall
from bot.agent.pinned import Pinned, pin, pinned
from bot.app.config import build_config
from bot.app.wiring import wire
from bot.llm.errors import AuthError, RateLimited
from bot.llm.openai import OpenAIClient
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Message, Request, Response, ToolCall, Usage
from bot.runtime import RunnerOptions
from bot.tools import ToolBox, builtin_tools
from store import DONE, Entry, Writes, conversation_namespace
from tests.fakes.llm_server import FakeLLMServer, Reply, replies

OPTIONS = RunnerOptions(concurrency=4, lease_seconds=5, retry_base_seconds=0.01,
                        retry_max_seconds=0.02, poll_seconds=0.02)


def todo_call(item: str, call_id: str = "c1") -> Response:
    return Response(tool_calls=[ToolCall(id=call_id, name="todo",
                                         arguments={"action": "add", "item": item})])


class Agent:
    def __init__(self, store, client, tmp_path, llm=None, **agent_config):
        self.store = store
        self.config = build_config({"agent": agent_config, "llm": llm or {},
                                    "runtime": {"retry_base_seconds": 0.01,
                                                "retry_max_seconds": 0.02}}, home=tmp_path)
        self.http = httpx.AsyncClient()
        app = wire(self.config, store, client, self.http, toolbox=ToolBox(*builtin_tools()),
                   options=OPTIONS)
        self.deps, self.runner = app.deps, app.runner

    async def say(self, text: str, session="cli:t", request_id=None) -> str:
        accepted = await submit_message(self.store, channel="cli",
                                        external_ids=[request_id or text],
                                        conversation_key=session, text=text, author="you")
        return accepted.turn_id

    async def run(self):
        await asyncio.wait_for(self.runner.run(until_idle=True), 30)

    async def close(self):
        await self.http.aclose()

    async def log(self, session="cli:t") -> list[Entry]:
        conv = await self.store.get_conversation(session)
        return await self.store.entries_page(conv.id, limit=500)


@pytest.fixture
async def make_agent(store, tmp_path):
    made = []

    def make(client, **agent_config):
        made.append(Agent(store, client, tmp_path, **agent_config))
        return made[-1]

    yield make
    for agent in made:
        await agent.close()


async def test_turn_with_a_tool_round(make_agent):
    model = ScriptedModel([todo_call("buy milk"), Response(text="Added it.")])
    agent = make_agent(model)
    turn = await agent.say("remember milk")
    await agent.run()
    task = await agent.store.get_task(turn)
    assert (task.state, task.result["text"]) == (DONE, "Added it.")
    log = await agent.log()
    assert [(e.kind, e.text) for e in log] == [
        ("user", "remember milk"), ("assistant", ""),
        ("tool_result", "1. [ ] buy milk"), ("assistant", "Added it.")]
    assert log[1].data["tool_calls"][0]["name"] == "todo"
    # the second request carried the call and its result, paired
    second = model.requests[1].messages
    assert [m.role for m in second] == ["system", "user", "assistant", "tool"]
    assert second[3].tool_call_id == "c1"
    # the document changed in the tool's result commit; that version belongs to the
    # position of the message that called the tool
    ns = conversation_namespace(log[0].conversation_id)
    assert (await agent.store.read_document(ns, "todo", as_of_seq=1)).value == {"items": []}
    doc = await agent.store.read_document(ns, "todo", as_of_seq=2)
    assert (doc.value, doc.at_seq) == (
        {"items": [{"id": 1, "text": "buy milk", "done": False}], "next_id": 2}, 2)
    assert (await agent.store.usage_totals())["calls"] == 2


async def test_tool_results_land_with_the_next_model_request(make_agent, monkeypatch):
    # One commit, not two: the state "results recorded, next request not asked for" would
    # protect nothing (the request is rebuilt from what landed), so they land together,
    # and the request holds the results as if they had landed before it was built.
    model = ScriptedModel([todo_call("buy milk"), Response(text="Added it.")])
    agent = make_agent(model)
    steps = []
    commit = agent.store.commit

    async def recording(writes, *args, **kwargs):
        steps.append(([e.kind for e in writes.entries], [t.kind for t in writes.tasks]))
        return await commit(writes, *args, **kwargs)

    monkeypatch.setattr(agent.store, "commit", recording)
    await agent.say("remember milk")
    await agent.run()
    with_results = [s for s in steps if "tool_result" in s[0]]
    assert with_results == [(["tool_result"], ["llm_call"])]
    second = model.requests[1].messages
    assert [(m.role, m.content) for m in second[2:]] == [("assistant", ""),
                                                         ("tool", "1. [ ] buy milk")]


async def test_an_answered_llm_call_keeps_only_the_outline_of_its_request(make_agent):
    # The pinned request is there to repeat the call after a crash; once answered it would
    # only fill the database (a long window is hundreds of KB per call).
    model = ScriptedModel([todo_call("buy milk"), Response(text="Added it.")])
    agent = make_agent(model)
    await agent.say("remember milk")
    await agent.run()
    calls = await agent.store.list_tasks(kind="llm_call")
    assert [c.state for c in calls] == [DONE, DONE]
    for call, sent in zip(sorted(calls, key=lambda c: c.created_at), model.requests,
                          strict=True):
        assert "request" not in call.inputs and "request_json" not in call.inputs
        outline = call.inputs["request_outline"]
        assert outline["messages"] == len(sent.messages)
        assert outline["tools"] == len(sent.tools) > 0
        assert outline["chars"] > 100


def test_a_request_pinned_by_an_earlier_build_is_still_sent_and_outlined():
    # Calls pinned before the request became one JSON text may be resumed after an upgrade.
    request = Request(model="m", tools=[], messages=[
        Message(role="system", content="be brief"), Message(role="user", content="héllo"),
        Message(role="assistant", tool_calls=[ToolCall(id="c1", name="t", arguments={"a": 1})]),
        Message(role="tool", content="done", tool_call_id="c1", name="t")])
    earlier = {"request": request.model_dump(mode="json"), "channel": "cli"}
    assert pinned(earlier) == request == pinned(pin(request))

    class Ctx:
        inputs = earlier

    kept = LLMCall(None).settled_inputs(Ctx)
    assert kept["channel"] == "cli" and "request" not in kept
    assert kept["request_outline"]["messages"] == 4
    Ctx.inputs = {**pin(request), "channel": "cli"}
    kept = LLMCall(None).settled_inputs(Ctx)
    assert set(kept) == {"channel", "request_outline"}
    assert kept["request_outline"]["chars"] == len(request.model_dump_json())


def test_a_call_run_where_it_was_pinned_sends_that_request_and_others_read_their_inputs():
    kept = Pinned(keep=2)
    requests = [Request(model="m", messages=[Message(role="user", content=str(i))])
                for i in range(3)]
    for i, r in enumerate(requests):
        kept.put(f"call{i}", r)
    assert kept.take("call2", {}) is requests[2]
    assert kept.take("call1", {}) is requests[1]
    # Pushed out (a call that ran elsewhere), or taken already: read from its inputs.
    assert kept.take("call0", pin(requests[0])) == requests[0]
    again = kept.take("call2", pin(requests[2]))
    assert again == requests[2] and again is not requests[2]


async def test_parallel_tool_calls_are_answered_in_call_order(make_agent):
    calls = Response(tool_calls=[
        ToolCall(id=f"c{i}", name="todo", arguments={"action": "add", "item": f"thing {i}"})
        for i in range(3)] + [ToolCall(id="c9", name="nope", arguments={})])
    agent = make_agent(ScriptedModel([calls, Response(text="ok")]))
    await agent.say("three things")
    await agent.run()
    results = [(e.data["tool_call_id"], e.data["is_error"]) for e in await agent.log()
               if e.kind == "tool_result"]
    assert results == [("c0", False), ("c1", False), ("c2", False), ("c9", True)]


async def test_follow_ups_wait_their_turn_and_keep_order(make_agent):
    seen = []

    last_roles = []
    working = asyncio.Event()

    async def slow(request):
        seen.append([m.content for m in request.messages if m.role == "user"])
        last_roles.append([m.role for m in request.messages])
        working.set()
        await asyncio.sleep(0.2)
        return Response(text=f"answer to {request.messages[-1].content}")

    agent = make_agent(ScriptedModel(slow))
    first = await agent.say("one")
    job = asyncio.create_task(agent.run())
    await asyncio.wait_for(working.wait(), 10)  # the first turn is working
    await agent.say("two")
    await job
    log = [(e.kind, e.text) for e in await agent.log()]
    assert log == [("user", "one"), ("user", "two"), ("assistant", "answer to one"),
                   ("assistant", "answer to two")]
    assert seen == [["one"], ["one", "two"]]  # the first turn did not see the follow-up
    assert last_roles[-1] == ["system", "user", "assistant", "user"]  # answer, then "two"
    assert (await agent.store.get_task(first)).state == DONE


async def test_queued_follow_ups_are_answered_together(make_agent):
    working = asyncio.Event()

    async def reply(request):
        working.set()
        await asyncio.sleep(0.2)
        assert request.messages[-1].role == "user"
        users = [m.content for m in request.messages if m.role == "user"]
        return Response(text="re: " + " + ".join(users))

    agent = make_agent(ScriptedModel(reply))
    await agent.say("a")
    job = asyncio.create_task(agent.run())
    await asyncio.wait_for(working.wait(), 10)  # the first turn is working
    await agent.say("b")
    third = await agent.say("c")
    await job
    finals = [e.text for e in await agent.log() if e.kind == "assistant"]
    assert finals == ["re: a", "re: a + b + c"]  # b and c answered together, once
    assert (await agent.store.get_task(third)).result.get("covered_by")


async def test_every_attempt_goes_to_the_ledger(make_agent):
    model = ScriptedModel([RateLimited("slow down", retry_after=0.01),
                           Response(text="hi")])
    agent = make_agent(model)
    await agent.say("hello")
    await agent.run()
    async with agent.store.engines.read.connect() as conn:
        from sqlalchemy import select

        from store.schema import usage
        rows = (await conn.execute(select(usage.c.ok, usage.c.error)
                                   .order_by(usage.c.id))).all()
    assert [r.ok for r in rows] == [False, True]
    assert "slow down" in rows[0].error


async def test_a_long_rate_limit_is_told_with_how_long_to_wait(make_agent):
    agent = make_agent(ScriptedModel([RateLimited("slow down", retry_after=3600)]))
    turn = await agent.say("hello")
    await agent.run()
    text = (await agent.store.get_task(turn)).result["text"]
    assert "wait about 60 minutes" in text


async def test_a_provider_error_reaches_the_person_short_and_without_its_text(make_agent,
                                                                                caplog):
    """What the provider said can echo a key's tail into a shared channel: the person gets
    a short generic line, the log gets the detail with the secret taken out."""
    refusal = AuthError("Incorrect API key provided: sk-proj-abc1********************xyz9. "
                        "You can find your API key at https://platform.example/account",
                        key_env="MY_KEY")
    agent = make_agent(ScriptedModel([refusal]))
    turn = await agent.say("hello")
    with caplog.at_level("WARNING", logger="bot.agent.apology"):
        await agent.run()
    text = (await agent.store.get_task(turn)).result["text"]
    assert text == ("Sorry, I could not get an answer from the model: the model provider "
                    "refused my credentials (check the API key in the environment variable "
                    "MY_KEY).")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "Incorrect API key provided" in logged and "sk-proj" not in logged
    # Nor is it kept: the call's result and the ledger (both shown by the inspector).
    [call] = await agent.store.list_tasks(kind="llm_call")
    assert "Incorrect API key" in call.result["error"] and "sk-proj" not in call.result["error"]
    async with agent.store.engines.read.connect() as conn:
        from sqlalchemy import select

        from store.schema import usage as ledger
        errors = list((await conn.execute(select(ledger.c.error))).scalars())
    assert errors and all("sk-proj" not in e for e in errors), errors


async def test_the_ledger_prices_each_call(make_agent):
    usage = Usage(input_tokens=2000, output_tokens=500, cache_read_tokens=1000)
    model = ScriptedModel([Response(text="hi", usage=usage),
                           Response(text="again", usage=usage.model_copy(
                               update={"cost_usd": 0.5}))])
    agent = make_agent(model, llm={"input_price_per_mtok": 2.0, "output_price_per_mtok": 10.0,
                                   "cache_read_price_per_mtok": 0.5})
    await agent.say("hello")
    await agent.run()
    await agent.say("more")
    await agent.run()
    async with agent.store.engines.read.connect() as conn:
        from sqlalchemy import select

        from store.schema import usage as ledger
        costs = (await conn.execute(select(ledger.c.cost_usd).order_by(ledger.c.id))).scalars()
    # 1000 fresh x 2 + 1000 cached x 0.5 + 500 out x 10, per million; then the provider's
    assert list(costs) == [pytest.approx(0.0075), 0.5]


async def test_auth_error_is_told_to_the_user_with_the_env_var(make_agent):
    with FakeLLMServer(replies(Reply(status=401))) as server:
        http = httpx.AsyncClient()
        client = OpenAIClient(http, base_url=f"{server.url}/v1", api_key="bad",
                              api_key_env="MY_KEY", model="m")
        agent = make_agent(client)
        turn = await agent.say("hello")
        await agent.run()
        await http.aclose()
        assert server.count("/v1/chat/completions") == 1  # not retried
    task = await agent.store.get_task(turn)
    assert task.state == DONE
    assert "MY_KEY" in task.result["text"]
    assert isinstance(AuthError("x"), Exception)


async def test_tool_rounds_are_bounded(make_agent):
    async def loop_forever(request):
        if request.tools:
            return todo_call("again", call_id=f"c{len(request.messages)}")
        return Response(text="giving up on tools")

    agent = make_agent(ScriptedModel(loop_forever), max_tool_rounds=3)
    turn = await agent.say("go")
    await agent.run()
    assert (await agent.store.get_task(turn)).result["text"] == "giving up on tools"
    assert sum(e.kind == "tool_result" for e in await agent.log()) == 3


async def test_context_pairs_tool_calls_with_results(store):
    conv = await store.ensure_conversation("cli:pairs")
    w = Writes()
    w.append(conv.id, "tool_result", "orphan", data={"tool_call_id": "x", "name": "t"})
    w.append(conv.id, "user", "hi")
    w.append(conv.id, "assistant", "", data={"tool_calls": [
        {"id": "a", "name": "t", "arguments": {}}, {"id": "b", "name": "t", "arguments": {}}]})
    w.append(conv.id, "tool_result", "for a", data={"tool_call_id": "a", "name": "t"})
    w.append(conv.id, "aborted", "half an ans")
    w.append(conv.id, "user", "again")
    await store.commit(w)
    messages = to_messages(await store.entries_page(conv.id))
    assert [(m.role, m.tool_call_id, m.is_error) for m in messages] == [
        ("user", None, False), ("assistant", None, False), ("tool", "a", False),
        ("tool", "b", True), ("user", None, False)]


async def test_context_window_reads_only_the_tail(store, tmp_path):
    conv = await store.ensure_conversation("cli:long")
    for start in range(0, 3000, 500):
        w = Writes()
        for n in range(start, start + 500):
            w.append(conv.id, "user" if n % 2 == 0 else "assistant", f"message {n} " + "x" * 90)
        await store.commit(w)
    config = build_config({"llm": {"context_window": 2000, "max_output_tokens": 500}},
                          home=tmp_path)
    request = (await build_request(store, config, conv.id, tools=[], model="m")).request
    texts = [m.content for m in request.messages[1:]]
    assert texts[-1].startswith("message 2999 ")
    assert texts[0].startswith("message ") and len(texts) < 60  # the budget, not 3000
    assert request.messages[1].role == "user"


async def test_a_follow_up_answered_together_is_not_shown_again_after_the_answer(store):
    """Turn A started after B's message arrived, so A answered both; B's message must sit
    before A's answer, or the model would see it as still open and answer it twice."""
    conv = await store.ensure_conversation("cli:order")
    w = Writes()
    w.append(conv.id, "user", "m0", task_id="A")
    w.append(conv.id, "user", "m1", task_id="B")
    w.append(conv.id, "assistant", "both answered", task_id="A",
             data={"final": True, "answers_upto": 2})
    w.append(conv.id, "user", "m2", task_id="C")
    await store.commit(w)
    messages = to_messages(await store.entries_page(conv.id))
    assert [m.content for m in messages] == ["m0", "m1", "both answered", "m2"]


async def test_messages_a_turn_took_in_come_before_its_tool_round(store):
    conv = await store.ensure_conversation("cli:round")
    w = Writes()
    w.append(conv.id, "user", "m0", task_id="A")
    w.append(conv.id, "user", "m1", task_id="B")  # arrived before A started: A took it in
    w.append(conv.id, "assistant", "", task_id="A", data={
        "answers_upto": 2, "tool_calls": [{"id": "t", "name": "todo", "arguments": {}}]})
    w.append(conv.id, "tool_result", "ok", data={"tool_call_id": "t", "name": "todo"})
    w.append(conv.id, "user", "m2", task_id="C")  # arrived during A's round: waits
    await store.commit(w)
    messages = to_messages(await store.entries_page(conv.id))
    assert [(m.role, m.content) for m in messages] == [
        ("user", "m0"), ("user", "m1"), ("assistant", ""), ("tool", "ok"), ("user", "m2")]
