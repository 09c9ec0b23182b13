"""Where compaction cuts and what it summarises: never between a tool call and its result
or a question and its answer (also where a follow-up arrived in the middle of a tool
round, and where the summary's budget runs out), never a withdrawn question; the context
after any cut starts cleanly; and the cut's size follows the provider's reported usage."""

import asyncio

import httpx
import pytest

from bot.agent.context import WITHDRAWS, build_request, entry_chars, request_chars
from bot.agent.inbox import submit_message
from bot.app.config import build_config
from bot.app.wiring import wire
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, Usage
from bot.memory.compaction import KIND, choose_cut, open_at, transcript_between
from bot.runtime import RunnerOptions
from bot.tools import ToolBox
from store import DONE, Writes

OPTIONS = RunnerOptions(concurrency=4, retry_base_seconds=0.01, retry_max_seconds=0.02,
                        poll_seconds=0.02)


def user(text, task=None, **data):
    return ("user", text, data or None, task)


def calls(*ids, task=None, upto=None):
    data = {"tool_calls": [{"id": i, "name": "look", "arguments": {"q": i}} for i in ids]}
    if upto is not None:
        data["answers_upto"] = upto
    return ("assistant", "", data, task)


def result(call_id, text="result " + "r" * 40, task=None):
    return ("tool_result", text, {"tool_call_id": call_id, "name": "look"}, task)


def answer(text, task=None, upto=None):
    data = {"final": True, "answers_upto": upto} if upto is not None else None
    return ("assistant", text, data, task)


async def write(store, conv_id, rows):
    w = Writes()
    for kind, body, data, task in rows:
        w.append(conv_id, kind, body, data=data, task_id=task)
    await store.commit(w)
    return (await store.get_conversation_by_id(conv_id)).last_seq


async def padding(store, conv_id, n, start=0):
    """n plain exchanges (question and answer of a turn each)."""
    for k in range(start, start + n):
        seq = (await store.get_conversation_by_id(conv_id)).last_seq
        await write(store, conv_id, [user(f"padding question {k} " + "p" * 60, f"p{k}"),
                                     answer(f"padding answer {k}", f"p{k}", seq + 1)])


async def assert_clean(store, conv_id, cut):
    """Every tool call at or before `cut` has its result at or before it, and a user
    message comes right after it."""
    everything = await store.entries_page(conv_id, limit=10_000)
    before = [e for e in everything if e.seq <= cut]
    called = {c["id"] for e in before for c in (e.data or {}).get("tool_calls", [])}
    answered = {(e.data or {}).get("tool_call_id") for e in before if e.kind == "tool_result"}
    assert called <= answered, f"calls {called - answered} are cut from their results"
    after = [e for e in everything if e.seq > cut]
    results_after = {(e.data or {}).get("tool_call_id") for e in after
                     if e.kind == "tool_result"}
    assert not results_after & called
    assert after and after[0].kind == "user"


async def chars_from(store, conv_id, seq):
    return sum(entry_chars(e) for e in await store.entries_page(conv_id, after=seq - 1,
                                                                  limit=10_000)
               if e.kind in ("user", "assistant", "tool_result"))


async def test_a_follow_up_between_a_call_and_its_result_is_no_place_for_a_cut(store):
    conv = await store.ensure_conversation("cli:interleaved")
    await padding(store, conv.id, 6)
    s = (await store.get_conversation_by_id(conv.id)).last_seq
    # Turn t1 calls a tool; the follow-up's user entry is written at once, before the
    # result; t1 answers, then t2 (which started after t1's answer) answers the follow-up.
    last = await write(store, conv.id, [
        user("question one " + "q" * 80, "t1"),
        calls("x", task="t1", upto=s + 1),
        user("and a follow-up " + "f" * 80, "t2"),
        result("x", task="t1"),
        answer("answer one", "t1", s + 1),
        answer("answer two", "t2", s + 5)])
    follow_up = s + 3
    keep = await chars_from(store, conv.id, follow_up)  # exactly reached at the follow-up
    cut = await choose_cut(store, conv.id, after=0, last_seq=last, keep_chars=keep)
    assert cut == s, "the cut steps back to before the exchange"
    await assert_clean(store, conv.id, cut)
    # the same with history that has no turns (imported): the tool call alone decides
    conv2 = await store.ensure_conversation("cli:interleaved-import")
    await write(store, conv2.id, [user("old " + "o" * 80), answer("old answer")])
    last = await write(store, conv2.id, [
        user("question one " + "q" * 80), calls("y"), user("follow-up " + "f" * 80),
        result("y"), answer("answer one"), answer("answer two")])
    keep = await chars_from(store, conv2.id, 5)
    cut = await choose_cut(store, conv2.id, after=0, last_seq=last, keep_chars=keep)
    assert cut == 2
    await assert_clean(store, conv2.id, cut)


async def test_a_call_still_waiting_for_its_result_is_never_cut_off(store):
    conv = await store.ensure_conversation("cli:inflight")
    await padding(store, conv.id, 4)
    s = (await store.get_conversation_by_id(conv.id)).last_seq
    # t1's tool runs right now; a follow-up arrived meanwhile. No result yet.
    last = await write(store, conv.id, [user("question " + "q" * 80, "t1"),
                                        calls("z", task="t1", upto=s + 1),
                                        user("follow-up " + "f" * 80, "t2")])
    keep = await chars_from(store, conv.id, s + 3)
    assert await open_at(store, conv.id, s + 2, 0) == s + 2
    cut = await choose_cut(store, conv.id, after=0, last_seq=last, keep_chars=keep)
    assert cut == s


async def test_an_unanswered_question_stays_with_its_answer(store):
    conv = await store.ensure_conversation("cli:question")
    await padding(store, conv.id, 4)
    s = (await store.get_conversation_by_id(conv.id)).last_seq
    # t1 is still thinking when a follow-up comes; cutting before the follow-up would
    # summarise t1's question while its answer lands in the window
    last = await write(store, conv.id, [user("question " + "q" * 80, "t1"),
                                        user("follow-up " + "f" * 80, "t2"),
                                        answer("both answered", "t1", s + 2)])
    assert await open_at(store, conv.id, s + 1, 0) == s + 1
    assert await open_at(store, conv.id, s + 3, 0) is None
    keep = await chars_from(store, conv.id, s + 2)
    assert await choose_cut(store, conv.id, after=0, last_seq=last, keep_chars=keep) == s


async def test_the_summary_budget_stops_only_where_no_exchange_is_open(store):
    conv = await store.ensure_conversation("cli:budget")
    seq = 0
    for n in range(8):  # each turn: question, a call, a large result, the answer
        seq = await write(store, conv.id, [
            user(f"question {n} " + "q" * 50, f"t{n}"),
            calls(f"c{n}", task=f"t{n}", upto=seq + 1),
            result(f"c{n}", f"result {n} " + "r" * 400, task=f"t{n}"),
            answer(f"answer {n}", f"t{n}", seq + 1)])
    for budget in range(200, 3000, 97):
        text, upto = await transcript_between(store, conv.id, 0, seq, budget)
        assert 0 < upto < seq
        await assert_clean(store, conv.id, upto)
        assert text.endswith(f"answer {(upto - 4) // 4}")
        # the next summary starts where this one stopped, and stops cleanly too
        _, nxt = await transcript_between(store, conv.id, upto, seq, budget)
        assert nxt > upto
        await assert_clean(store, conv.id, nxt) if nxt < seq else None
    # a single exchange larger than the budget is finished (in short lines), not split
    text, upto = await transcript_between(store, conv.id, 0, seq, 100)
    assert upto == 4 and "answer 0" in text


async def test_a_budget_stop_is_never_inside_an_interleaved_tool_round(store):
    conv = await store.ensure_conversation("cli:budget-interleaved")
    await padding(store, conv.id, 3)
    s = (await store.get_conversation_by_id(conv.id)).last_seq
    last = await write(store, conv.id, [
        user("question one " + "q" * 80, "t1"),
        calls("x", task="t1", upto=s + 1),
        user("a follow-up " + "f" * 80, "t2"),
        result("x", "r" * 600, task="t1"),
        answer("answer one", "t1", s + 1),
        answer("answer two", "t2", s + 5)])
    await padding(store, conv.id, 3, start=3)
    upto_all = (await store.get_conversation_by_id(conv.id)).last_seq
    head, _ = await transcript_between(store, conv.id, 0, upto_all, 10**6)
    # budgets that run out inside the interleaved exchange stop before it
    for budget in range(len(head.split("a follow-up")[0]) - 150, len(head) - 700, 40):
        _, upto = await transcript_between(store, conv.id, 0, upto_all, budget)
        assert upto <= s or upto >= last, (budget, upto)
        await assert_clean(store, conv.id, upto)


async def test_withdrawn_questions_are_not_summarised(store):
    conv = await store.ensure_conversation("cli:withdrawn")
    await padding(store, conv.id, 3)
    s = (await store.get_conversation_by_id(conv.id)).last_seq
    last = await write(store, conv.id, [
        user("what is the SECRET-ONE plan", "t1"),
        ("system", "(a message was deleted)", {WITHDRAWS: [s + 1]}, None),
        user("what is the SECRET-TWO plan", "t2"),
        user("and this one stays", "t3"),
        ("user", "(deleted a message)", {WITHDRAWS: [s + 3]}, None),
        answer("only the third was answered", "t3", s + 5)])
    await padding(store, conv.id, 2, start=3)
    text, upto = await transcript_between(store, conv.id, 0, last, 10**6)
    assert upto == last
    assert "SECRET" not in text
    assert "and this one stays" in text and "(deleted a message)" in text
    # before its note, a question still open to withdrawal is no place for a cut either
    assert await open_at(store, conv.id, s + 4, 0) == s + 3
    assert await open_at(store, conv.id, s + 5, 0) == s + 4  # t3 answers after it
    assert await open_at(store, conv.id, s + 6, 0) is None


def summarizing(requests):
    def reply(request):
        requests.append(request)
        if "running summary" in request.messages[0].content:
            return Response(text="SUMMARY of earlier talk")
        # reports exactly one token a character: the estimate follows it
        return Response(text="ok", usage=Usage(input_tokens=request_chars(request)))
    return reply


@pytest.fixture
async def deps(store, tmp_path):
    http = httpx.AsyncClient()
    made = []

    def make(client, config):
        app = wire(build_config(config, home=tmp_path), store, client, http,
                   toolbox=ToolBox(), options=OPTIONS)
        made.append(app.deps)
        return app.deps, app.runner

    yield make
    await http.aclose()


async def compact_now(store, runner, conv_id):
    w = Writes()
    task_id = w.spawn(KIND, {"reason": "test"}, conversation_id=conv_id)
    await store.commit(w)
    await asyncio.wait_for(runner.run(until_idle=True), 60)
    return await store.get_task(task_id)


async def test_compaction_skips_withdrawn_questions_end_to_end(store, deps):
    requests = []
    d, runner = deps(ScriptedModel(summarizing(requests)),
                     {"compaction": {"keep_recent_tokens": 50}})
    conv = await store.ensure_conversation("cli:e2e")
    await padding(store, conv.id, 3)
    s = (await store.get_conversation_by_id(conv.id)).last_seq
    await write(store, conv.id, [
        user("please book the SECRET-TRIP for me", "tw"),
        ("system", "(a message was deleted)", {WITHDRAWS: [s + 1]}, None)])
    await padding(store, conv.id, 4, start=3)
    task = await compact_now(store, runner, conv.id)
    assert task.state == DONE and task.result["cut"] > s + 2
    [summary_request] = requests
    said = summary_request.messages[1].content
    assert "padding question 0" in said and "SECRET" not in said


async def test_the_cut_keeps_as_much_as_the_reported_usage_says(store, deps):
    """Compact sizes `keep_recent_tokens` with the same estimate as the context: after a
    provider reported one token a character, the kept tail is about that many characters
    (the fixed three characters a token kept three times as much)."""
    requests = []
    config = {"llm": {"context_window": 20_000, "max_output_tokens": 500},
              "compaction": {"enabled": False, "keep_recent_tokens": 600}}
    d, runner = deps(ScriptedModel(summarizing(requests)), config)
    conv = await store.ensure_conversation("cli:ratio")
    await padding(store, conv.id, 30)
    # one turn, so that an llm_call reports its usage in this conversation
    await submit_message(store, channel="cli", external_ids=["r:1"],
                         conversation_key="cli:ratio", text="hello")
    await asyncio.wait_for(runner.run(until_idle=True), 60)
    task = await compact_now(store, runner, conv.id)
    assert task.state == DONE, task.result
    kept = await chars_from(store, conv.id, task.result["cut"] + 1)
    assert 600 <= kept < 600 + 200, kept


async def test_the_context_after_a_cut_never_starts_with_an_orphaned_result(store, deps):
    """Even a head marker written by an older build that cut between a call and its
    result (or before a follow-up written in the middle of a tool round) gives the model
    a context that starts with a user message and has no result without its call."""
    d, _ = deps(ScriptedModel([]), {})
    conv = await store.ensure_conversation("cli:legacy")
    await padding(store, conv.id, 2)
    s = (await store.get_conversation_by_id(conv.id)).last_seq
    await write(store, conv.id, [
        user("question one", "t1"), calls("x", task="t1", upto=s + 1),
        user("a follow-up", "t2"), result("x", task="t1"),
        answer("answer one", "t1", s + 1), answer("answer two", "t2", s + 5)])
    for cut, first in ((s + 2, "user"), (s + 3, "assistant")):
        w = Writes()
        w.append(conv.id, "compaction", "SUMMARY", data={"cut_seq": cut}, head=True)
        await store.commit(w)
        window = (await build_request(store, d.config, conv.id, tools=[], model="m"))
        assert window.window.entries[0 if cut == s + 3 else 1].kind == "tool_result"
        body = window.request.messages[1:]
        assert body[0].role == first  # (no user message is left after s + 3)
        assert all(m.role != "tool" for m in body)


async def test_a_summary_cut_off_at_the_length_limit_says_so(store, deps):
    """A summary the model stopped at its length limit is not kept as if it were whole:
    the part written is kept (it is what there is), marked as cut off, and the task says
    so in its result."""
    def cut(request):
        return Response(text="SUMMARY of earlier talk, and then", stop_reason="length")

    d, runner = deps(ScriptedModel(cut), {"compaction": {"keep_recent_tokens": 50}})
    conv = await store.ensure_conversation("cli:cut")
    await padding(store, conv.id, 6)
    task = await compact_now(store, runner, conv.id)
    assert task.state == DONE and task.result.get("cut_off") is True, task.result
    [summary] = [e for e in await store.entries_page(conv.id, limit=1000)
                 if e.kind == "compaction"]
    assert summary.text.startswith("SUMMARY of earlier talk, and then")
    assert "cut off" in summary.text
