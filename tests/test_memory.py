"""Years-long memory: the cut rules, compaction triggers (including a provider's overflow
error and a failing summarizer), facts and their scopes, and a window over 10^6 entries."""

import asyncio
import time

import httpx
import pytest
from sqlalchemy import text

from bot.agent.context import build_request, entry_chars
from bot.agent.inbox import submit_message
from bot.app.config import build_config
from bot.app.wiring import wire
from bot.llm.errors import ServerError
from bot.llm.openai import OpenAIClient
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, ToolCall
from bot.memory.compaction import choose_cut, compaction_due
from bot.memory.facts import FACT_TOOLS, facts_for
from bot.memory.recall import recall
from bot.runtime import RunnerOptions
from bot.tools import ToolBox
from store import DONE, FAILED, Writes
from tests.fakes.llm_server import FakeLLMServer, Reply

OPTIONS = RunnerOptions(concurrency=4, retry_base_seconds=0.01, retry_max_seconds=0.02,
                        poll_seconds=0.02)
SMALL = {"llm": {"context_window": 3000, "max_output_tokens": 200},
         "compaction": {"reserve_tokens": 800, "keep_recent_tokens": 300},
         "runtime": {"max_attempts": 2, "retry_base_seconds": 0.01,
                     "retry_max_seconds": 0.02}}


def summarizing(answer="noted"):
    """A model that answers turns briefly and summaries recognisably."""
    def reply(request):
        if "running summary" in request.messages[0].content:
            return Response(text="SUMMARY: the user talked about many things.")
        return Response(text=answer)
    return reply


class Harness:
    def __init__(self, store, client, tmp_path, config=SMALL):
        self.store = store
        self.http = httpx.AsyncClient()
        app = wire(build_config(config, home=tmp_path), store, client, self.http,
                   toolbox=ToolBox(*FACT_TOOLS), options=OPTIONS)
        self.deps, self.runner = app.deps, app.runner
        self.n = 0

    async def say(self, text_, session="cli:m", owner=None, scope=None):
        self.n += 1
        accepted = await submit_message(self.store, channel="cli",
                                        external_ids=[f"{session}:{self.n}"],
                                        conversation_key=session, text=text_, owner=owner,
                                        scope=scope)
        await asyncio.wait_for(self.runner.run(until_idle=True), 60)
        return await self.store.get_task(accepted.turn_id)


@pytest.fixture
async def harness(store, tmp_path):
    made = []

    def make(client, config=SMALL):
        made.append(Harness(store, client, tmp_path, config))
        return made[-1]

    yield make
    for h in made:
        await h.http.aclose()


async def append(store, conv_id, kinds_texts):
    w = Writes()
    for kind, body, data in kinds_texts:
        w.append(conv_id, kind, body, data=data)
    await store.commit(w)


async def test_the_cut_falls_before_a_user_message_never_between_a_call_and_its_result(store):
    conv = await store.ensure_conversation("cli:cut")
    call = {"tool_calls": [{"id": "a", "name": "t", "arguments": {}}]}
    rows = []
    for n in range(10):
        rows += [("user", f"question {n} " + "x" * 50, None),
                 ("assistant", "", call),
                 ("tool_result", "y" * 300, {"tool_call_id": "a", "name": "t"}),
                 ("assistant", f"answer {n}", None)]
    await append(store, conv.id, rows)
    for keep in (100, 400, 900, 2000):
        cut = await choose_cut(store, conv.id, after=0, last_seq=40, keep_chars=keep)
        [first_kept] = await store.entries_page(conv.id, after=cut, limit=1)
        assert first_kept.kind == "user"
        kept = await store.entries_page(conv.id, after=cut, limit=100)
        assert sum(entry_chars(e) for e in kept) >= keep
    assert await choose_cut(store, conv.id, after=0, last_seq=40, keep_chars=10**6) is None
    assert await choose_cut(store, conv.id, after=36, last_seq=40, keep_chars=100) is None


async def test_history_is_compacted_in_the_background_and_stays_on_disk(harness, store):
    summarised = []

    async def reply(request):
        if "running summary" not in request.messages[0].content:
            return Response(text="noted")
        # In the background, the turn that started the compaction answers without it: the
        # summary is only written once no turn is active. (A turn waiting for its summary
        # would never end, and the summary would fail.)
        deadline = time.monotonic() + 20
        while await store.list_tasks(kind="turn", active=True, limit=1):
            if time.monotonic() > deadline:
                raise ServerError("a turn is waiting for this summary")
            await asyncio.sleep(0.01)
        summarised.append(request)
        return Response(text="SUMMARY: the user talked about many things.")

    model = ScriptedModel(reply)
    h = harness(model)
    for n in range(40):
        await h.say(f"message number {n}: " + "words " * 30)
    conv = await store.get_conversation("cli:m")
    assert conv.head_seq, "a head marker was set"
    compactions = await store.list_tasks(kind="compact", state=DONE)
    assert compactions and len(summarised) == len(compactions)
    assert not await store.list_tasks(kind="compact", state=FAILED)
    # each ran as a task of its own: no turn spawned it as a child or waited for it
    assert all(t.parent_id is None for t in compactions)
    turns = await store.list_tasks(kind="turn", limit=100)
    assert len(turns) == 40
    assert not any((t.checkpoint or {}).get("compacted") for t in turns)
    [marker] = await store.entries_page(conv.id, after=conv.head_seq - 1, limit=1)
    assert marker.kind == "compaction" and marker.text.startswith("SUMMARY")
    # the model now gets the summary and the recent tail, not the old messages...
    request = (await build_request(store, h.deps.config, conv.id, tools=[],
                                   model="m")).request
    assert "SUMMARY" in request.messages[0].content
    assert "message number 0:" not in " ".join(m.content for m in request.messages)
    assert request.messages[-2].content.startswith("message number 39")
    # ...while every message stays on disk
    everything = await store.entries_page(conv.id, limit=1000)
    assert sum(e.kind == "user" for e in everything) == 40
    # and summary calls went to the usage ledger like any other
    assert (await store.usage_totals())["calls"] == 40 + len(compactions)


async def test_memories_outside_the_window_are_recalled_for_the_newest_message(harness,
                                                                               store):
    model = ScriptedModel(summarizing())
    h = harness(model)
    await h.say("my locker code is zebra4412, remember the gym")
    for n in range(40):
        await h.say(f"filler {n}: " + "words " * 30)
    assert (await store.get_conversation("cli:m")).head_seq  # the code left the window
    await h.say("what was that zebra4412 thing again?")
    request = [r for r in model.requests if "running summary" not in r.messages[0].content][-1]
    notes = [m.content for m in request.messages[1:] if m.role == "system"]
    assert len(notes) == 1 and "my locker code is zebra4412" in notes[0]
    assert request.messages[-1].content == "what was that zebra4412 thing again?"
    assert request.messages[-2].role == "system"  # late: the stable prefix stays cached


async def test_a_full_window_waits_for_the_summary(harness, store):
    model = ScriptedModel(summarizing())
    config = {**SMALL, "compaction": {"reserve_tokens": 0, "keep_recent_tokens": 300}}
    h = harness(model, config)
    for n in range(25):
        await h.say(f"message {n}: " + "lorem ipsum " * 60)
    turn_requests = [r for r in model.requests if "running summary" not in
                     r.messages[0].content]
    after = [r for r in turn_requests if "SUMMARY" in r.messages[0].content]
    assert after, "a turn continued with the summary in its context"
    blocking = [t for t in await store.list_tasks(kind="compact") if t.parent_id]
    assert blocking  # spawned as the turn's child: the turn waited for it


async def test_context_overflow_compacts_and_retries_once(harness, store):
    calls = []

    def responder(request, wire):
        calls.append(request)
        system = request["messages"][0]["content"]
        if "running summary" in system:
            return Reply(text="SUMMARY: earlier talk.")
        if len(calls) == 1 or ("SUMMARY" not in system and len(calls) > 2):
            return Reply(status=400, error_body={"error": {
                "message": "This model's maximum context length is 100 tokens",
                "code": "context_length_exceeded"}})
        return Reply(text="fits now")

    with FakeLLMServer(responder) as server:
        http = httpx.AsyncClient()
        client = OpenAIClient(http, base_url=f"{server.url}/v1", api_key="k", model="m")
        h = harness(client, {**SMALL, "compaction": {"reserve_tokens": 0,
                                                     "keep_recent_tokens": 30}})
        conv = await store.ensure_conversation("cli:m")
        for n in range(6):  # some history to summarise
            await append(store, conv.id, [("user", f"old question {n} " + "q" * 80, None),
                                          ("assistant", f"old answer {n}", None)])
        turn = await h.say("and now?")
        await http.aclose()
    assert turn.result["text"] == "fits now"
    assert len(calls) == 3  # overflow, summary, retry
    assert (await store.get_conversation("cli:m")).head_seq


async def test_a_failing_summarizer_loses_nothing_and_backs_off(harness, store):
    def reply(request):
        if "running summary" in request.messages[0].content:
            raise ServerError("summarizer down")
        return Response(text="still here")

    async def areply(request):
        return reply(request)

    h = harness(ScriptedModel(areply))
    for n in range(30):
        turn = await h.say(f"message {n}: " + "words " * 60)
        assert turn.state == DONE and turn.result["text"] == "still here"
    conv = await store.get_conversation("cli:m")
    assert conv.head_seq is None
    failed = await store.list_tasks(kind="compact", state=FAILED)
    assert 1 <= len(failed) <= 2  # retried with backoff, not on every turn
    assert not await compaction_due(store, conv.id)
    # the turn went on with the oldest entries left out of its window, all still on disk
    request = (await build_request(store, h.deps.config, conv.id, tools=[],
                                   model="m")).request
    assert "message 0:" not in " ".join(m.content for m in request.messages)
    assert sum(e.kind == "user" for e in await store.entries_page(conv.id, limit=500)) == 30


async def test_facts_are_remembered_and_never_cross_scopes(harness, store):
    def reply(request):
        last = request.messages[-1]
        if last.role == "user" and last.content.startswith("remember"):
            return Response(tool_calls=[ToolCall(id="f1", name="remember_fact", arguments={
                "fact": last.content.removeprefix("remember ")})])
        return Response(text="ok")

    h = harness(ScriptedModel(reply), {})
    await h.say("remember my sister lives in Graz", session="slack:T:DANA", owner="ana",
                scope="private:ana")
    await h.say("hello", session="slack:T:DANA:2", owner="ana", scope="private:ana")
    await h.say("hello", session="slack:T:DBEN", owner="ben", scope="private:ben")
    await h.say("hello", session="slack:T:CSHARED", owner="ana", scope="channel:CSHARED")
    ana = await store.get_conversation("slack:T:DANA:2")
    ben = await store.get_conversation("slack:T:DBEN")
    shared = await store.get_conversation("slack:T:CSHARED")
    assert "sister lives in Graz" in await facts_for(store, ana.id, 4000)
    assert await facts_for(store, ben.id, 4000) == ""
    assert await facts_for(store, shared.id, 4000) == ""
    model = h.deps.client
    contexts = {r.messages[-1].content + str(i): r.messages[0].content
                for i, r in enumerate(model.requests)}
    assert any("Graz" in c for c in contexts.values())
    ben_request = model.requests[-2].messages[0].content
    assert "Graz" not in ben_request


async def bulk_entries(store, conv_id: int, n: int) -> None:
    """Insert n entries with one statement on the server side (no Python loop)."""
    async with store.engines.write.begin() as conn:
        if store.dialect == "sqlite":
            await conn.execute(text(
                "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < :n) "
                "INSERT INTO entries (conversation_id, seq, kind, text, created_at) "
                "SELECT :c, i, CASE i % 2 WHEN 1 THEN 'user' ELSE 'assistant' END, "
                "'entry ' || i || ' of a long history', :t FROM s"),
                {"n": n, "c": conv_id, "t": time.time()})
        else:
            await conn.execute(text(
                "INSERT INTO entries (conversation_id, seq, kind, text, created_at) "
                "SELECT :c, i, CASE i % 2 WHEN 1 THEN 'user' ELSE 'assistant' END, "
                "'entry ' || i || ' of a long history', :t FROM generate_series(1, :n) i"),
                {"n": n, "c": conv_id, "t": time.time()})
        await conn.execute(text("UPDATE conversations SET last_seq = :n WHERE id = :c"),
                           {"n": n, "c": conv_id})


@pytest.mark.parametrize("n", [100_000, pytest.param(1_000_000, marks=pytest.mark.slow)])
async def test_a_turn_on_a_huge_history_assembles_a_correct_window(harness, store, n):
    conv = await store.ensure_conversation("cli:m")
    await bulk_entries(store, conv.id, n)
    model = ScriptedModel(summarizing("fine"))
    h = harness(model, {"llm": {"context_window": 4000, "max_output_tokens": 500},
                        "compaction": {"enabled": False}})
    turn = await h.say("what did we talk about?")
    assert turn.result["text"] == "fine"
    request = model.requests[0]
    assert request.messages[-1].content == "what did we talk about?"
    assert request.messages[-2].content == f"entry {n} of a long history"
    seqs = [int(m.content.split()[1]) for m in request.messages[1:-1]]
    assert seqs == list(range(seqs[0], n + 1)) and len(seqs) < 500


async def test_a_fork_recalls_neither_its_parents_later_history_nor_its_siblings(store):
    """`steward context cli:p@3`: a fork at entry 3 must not be shown what the parent said
    after entry 3, nor what another fork of it said; its own past (the parent up to the
    fork point) and other conversations of the same scope are still recalled."""
    parent = await store.ensure_conversation("cli:p")
    await append(store, parent.id, [("user", "the zebra4412 locker is near the pool", None),
                                    ("assistant", "noted", None),
                                    ("user", "thanks", None),
                                    ("assistant", "welcome", None),
                                    ("user", "something else entirely", None),
                                    ("user", "the zebra4412 code changed to 9911", None)])
    fork = await store.fork("cli:p", "cli:p@3", at_seq=3)
    sibling = await store.fork("cli:p", "cli:p@3b", at_seq=3)
    await append(store, sibling.id, [("user", "in the sibling zebra4412 means a bike", None)])
    other = await store.ensure_conversation("cli:other")
    await append(store, other.id, [("user", "at work zebra4412 is the wifi name", None)])

    found = await recall(store, fork, "what about zebra4412?", in_window=set())
    assert "near the pool" in found  # its own past, via the parent up to the fork point
    assert "wifi name" in found  # another conversation of the scope
    assert "9911" not in found and "bike" not in found
    # a fork's entries are another branch for the parent too
    w = Writes()
    w.append(parent.id, "compaction", "SUMMARY", data={"cut_seq": 6}, head=True)
    await store.commit(w)
    parent = await store.get_conversation("cli:p")
    found = await recall(store, parent, "what about zebra4412?", in_window=set())
    assert "9911" in found and "wifi name" in found and "bike" not in found
