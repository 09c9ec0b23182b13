"""Whole conversations with a local model server that behaves as llama.cpp does with a weak
model (tests/fakes/local_llm_server.py): whatever the model says and whatever the server
refuses, the turn ends with a real answer, nothing garbled runs, and the NEXT message of the
conversation is answered normally. The agent's runtime in-process, on both backends."""

import asyncio
import json

import httpx
import pytest

from bot.agent.turn import CUT_OFF, WITHOUT_TOOLS
from bot.app.wiring import host_of
from bot.llm.openai import OpenAIClient
from bot.llm.repair import IMAGE_NOTE
from bot.memory.facts import FACT_TOOLS
from bot.port import REF
from tests.fakes.agent_rig import rig_factory
from tests.fakes.local_llm_server import LocalLLMServer, Output
from tests.test_attachments import png


@pytest.fixture
async def local(store, tmp_path):
    """`make(server, **config) -> Rig` talking to `server` as `[llm] provider = "openai"`
    with a `base_url` would."""
    async with rig_factory(store, tmp_path) as make_rig, \
            httpx.AsyncClient(trust_env=False) as http:
        def make(server: LocalLLMServer, **config):
            client = OpenAIClient(http, base_url=server.url, api_key=None, model="gemma3")
            return make_rig(client, *FACT_TOOLS, config=config)
        yield make


async def ask(rig, text: str) -> str:
    turn = await rig.say(text)
    await rig.run()
    return (await rig.store.get_task(turn)).result["text"]


async def entries(rig):
    conv = await rig.store.get_conversation("cli:rig")
    return await rig.store.entries_page(conv.id, limit=500)


def garbled_calls() -> list[tuple[str, str, str]]:
    """What a 270M model's output became: 15 calls, some fine, unknown names, arguments
    that are not JSON, the last cut mid-JSON by the length limit."""
    calls = [(f"c{n}", "remember_fact", json.dumps({"fact": f"fact {n}"})) for n in range(8)]
    calls += [("c8", "remember", '{"fact": "x"}'), ("c9", "<|tool_call|>", "{}"),
              ("c10", "remember_fact", "fact: tea"), ("c11", "todo", '{"action": "add"'),
              ("c11", "remember_fact", "[1, 2]"), ("c13", "remember_fact", '{"fct": 1}'),
              ("c14", "remember_fact", '{"fact": "Anna likes t')]
    return calls


async def test_a_garbled_reply_runs_nothing_and_the_conversation_goes_on(local):
    with LocalLLMServer([Output(calls=garbled_calls(), finish="length"),
                         Output("Sorry, I got muddled."), Output("Hello.")]) as server:
        rig = local(server)
        assert await ask(rig, "remember that Anna likes tea") == "Sorry, I got muddled."
        assert await rig.store.list_tasks(kind="tool_call") == []  # none of the 15 ran
        assert await ask(rig, "hi again") == "Hello."
    assert server.statuses == [200, 200, 200]  # no request the server could not read
    log = await entries(rig)
    said = log[1].data["tool_calls"]
    assert len(said) == 15 and len({c["id"] for c in said}) == 15
    assert all(isinstance(c["arguments"], dict) and "_raw" not in c["arguments"]
               for c in said)
    results = [e for e in log if e.kind == "tool_result"]
    assert len(results) == 15 and all(e.data["is_error"] for e in results)
    assert "15 tool calls, more than the 8 allowed" in results[0].text
    # every call the server got back is JSON it parses
    for body in server.requests[1:]:
        for m in body["messages"]:
            for call in m.get("tool_calls") or []:
                assert isinstance(json.loads(call["function"]["arguments"]), dict)


async def test_only_the_calls_that_check_out_run(local):
    calls = [("a", "todo", '{"action": "add", "item": "milk"}'),
             ("b", "no_such_tool", "{}"), ("c", "todo", "add eggs please"),
             ("d", "todo", '{"action": "fly"}')]
    with LocalLLMServer([Output(calls=calls), Output("Added milk."),
                         Output("Hello.")]) as server:
        rig = local(server)
        assert await ask(rig, "add milk and eggs") == "Added milk."
        assert await ask(rig, "thanks") == "Hello."
    ran = await rig.store.list_tasks(kind="tool_call")
    assert [t.inputs["call"]["id"] for t in ran] == ["a"]
    results = [e for e in await entries(rig) if e.kind == "tool_result"]
    assert [(e.data["tool_call_id"], e.data["is_error"]) for e in results] == [
        ("a", False), ("b", True), ("c", True), ("d", True)]
    assert "no tool named 'no_such_tool'" in results[1].text
    assert "not a JSON object" in results[2].text
    assert "action" in results[3].text
    assert set(server.statuses) == {200}


async def test_a_call_cut_by_the_length_limit_never_runs(local):
    calls = [("a", "todo", '{"action": "add", "item": "milk"}'),
             ("b", "todo", '{"action": "add", "item": "bread"}')]
    with LocalLLMServer([Output(calls=calls, finish="length"), Output("Added milk."),
                         Output("Hello.")]) as server:
        rig = local(server)
        assert await ask(rig, "add milk and bread") == "Added milk."
        assert await ask(rig, "thanks") == "Hello."
    ran = await rig.store.list_tasks(kind="tool_call")
    assert [t.inputs["call"]["id"] for t in ran] == ["a"]
    cut = [e for e in await entries(rig) if e.kind == "tool_result"][1]
    assert cut.data["is_error"] and "cut off" in cut.text


async def test_a_strict_template_gets_alternating_roles(local):
    calls = [("a", "todo", '{"action": "add", "item": "milk"}'),
             ("b", "todo", '{"action": "add", "item": "eggs"}')]
    with LocalLLMServer([Output(calls=calls), Output("Added both."), Output("Hello.")],
                        strict_roles=True) as server:
        rig = local(server)
        assert await ask(rig, "add milk and eggs") == "Added both."
        assert await ask(rig, "thanks") == "Hello."
    # refused once, learned, and every later request taken
    assert server.statuses.count(400) == 1 and server.statuses[-1] == 200
    assert len(await rig.store.list_tasks(kind="tool_call")) == 2


async def test_a_reply_cut_by_length_is_not_shown_as_complete(local):
    with LocalLLMServer([Output("The three reasons are: first, the", finish="length"),
                         Output("Hello.")]) as server:
        rig = local(server)
        answer = await ask(rig, "why?")
        assert answer == f"The three reasons are: first, the\n\n{CUT_OFF}"
        assert await ask(rig, "go on") == "Hello."


async def test_an_image_to_a_text_only_server_is_left_out_and_said(local):
    with LocalLLMServer([Output("A picture, I gather."), Output("Hello.")]) as server:
        rig = local(server)
        port = host_of(rig.deps.config, rig.deps).port  # what a connector is handed
        kept = await port.keep(png(64, 64), name="cat.png", media_type="image/png")
        accepted = await port.submit(channel="cli", external_ids=["m1"],
                                     conversation_key="cli:rig", author="you",
                                     text=f"what is this?\n\n{kept.text}",
                                     data={REF: [kept.ref]})
        await rig.run()
        answer = (await rig.store.get_task(accepted.turn_id)).result["text"]
        assert answer == f"A picture, I gather.\n\n{IMAGE_NOTE}"
        assert await ask(rig, "never mind") == "Hello."  # no note: it sent no image
    assert server.statuses == [500, 200, 200]  # learned: the image is not sent again
    assert "image_url" not in json.dumps(server.requests[2])


async def test_a_restarting_server_is_waited_for(local):
    with LocalLLMServer([Output("Hello.")]) as server:
        rig = local(server, llm={"wait_for_server_seconds": 60})
        assert await ask(rig, "hi") == "Hello."
        server.stop()  # restarting: refused, then loading its model
        asking = asyncio.create_task(ask(rig, "still there?"))
        refused = await until(lambda: failed_attempts(rig, "ConnectError"), asking)
        assert refused >= 2  # more than the two quick tries of a server never seen
        server.back(loading=2)
        assert await asking == "Hello."
    assert server.statuses == [200, 503, 503, 200]
    assert await failed_attempts(rig, "Loading model") == 2


async def failed_attempts(rig, words: str) -> int:
    """How many failed attempts the usage ledger holds whose error says `words`."""
    async with rig.store.engines.read.connect() as conn:
        from sqlalchemy import select

        from store.schema import usage
        errors = (await conn.execute(select(usage.c.error).where(usage.c.ok.is_(False))))
        return sum(words in (e or "") for e in errors.scalars())


async def until(count, task, at_least: int = 3, seconds: float = 30.0) -> int:
    """Poll `count()` until it reaches `at_least` (the task must still be running)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while (n := await count()) < at_least:
        assert not task.done(), task
        assert asyncio.get_running_loop().time() < deadline, n
        await asyncio.sleep(0.05)
    return n


async def test_a_process_that_ends_while_waiting_is_followed_by_one_that_waits_on(local):
    with LocalLLMServer([Output("Hello.")]) as server:
        rig = local(server, llm={"wait_for_server_seconds": 120})
        assert await ask(rig, "hi") == "Hello."
        server.stop()
        turn = await rig.say("still there?")
        first = asyncio.create_task(rig.run())
        refused = await until(lambda: failed_attempts(rig, "ConnectError"), first)
        await rig.runner.drain(0)  # the process ends mid-wait: its call is cut off
        await first
        # A new process: a new client that has never reached the server, and a runner
        # that takes the call over. It does not give up after two quick tries.
        again = local(server, llm={"wait_for_server_seconds": 120})
        await again.runner.recover(steal_all=True)  # as `steward run` starts
        second = asyncio.create_task(again.run())
        await until(lambda: failed_attempts(rig, "ConnectError"), second,
                    at_least=refused + 3)
        server.back(loading=0)
        await second
        assert (await rig.store.get_task(turn)).result["text"] == "Hello."


async def test_a_request_the_server_never_takes_is_told_and_the_next_one_works(local):
    with LocalLLMServer([Output("Hello.")]) as server:
        rig = local(server)
        answer = server.answer
        server.answer = lambda body: (500, {"error": {
            "code": 500, "type": "server_error",
            "message": "Failed to parse input at pos 0: <start_of_turn>"}})
        told = await ask(rig, "hi")
        server.answer = answer
        assert await ask(rig, "hi again") == "Hello."
    assert told.startswith("Sorry, I could not get an answer from the model: the model "
                           "server could not take what I sent")
    assert "having trouble" not in told  # not an outage
    assert server.statuses == [500, 500, 500, 200]  # as sent, plain, without tools; once


def overflowing_with_tools(answer):
    """A 2,048-token llama-server: the tools' schemas alone take most of it (as measured
    with a Qwen2.5 template: 2,121 tokens asked of 2,048 at the second message)."""
    def server(body):
        if body.get("tools"):
            return 400, {"error": {"code": 400, "type": "exceed_context_size_error",
                                   "message": "request (2121 tokens) exceeds the available "
                                              "context size (2048 tokens), try increasing it"}}
        return answer(body)
    return server


async def test_tools_that_do_not_fit_the_server_are_left_out_and_said(local):
    with LocalLLMServer([Output("Hello.")]) as server:
        rig = local(server)
        server.answer = overflowing_with_tools(server.answer)
        first = await ask(rig, "hi")
        assert await ask(rig, "and again") == first
    assert first == f"Hello.\n\n{WITHOUT_TOOLS}"
