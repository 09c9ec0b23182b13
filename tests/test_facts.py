"""Long-term facts: remember, update and forget by a number that stays with its fact,
parallel calls that name the facts the model saw, facts kept before they had numbers, and
which facts reach a context when they do not all fit. Store tests run on both backends."""

import pytest

from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, ToolCall
from bot.memory.facts import (
    DOC,
    FACT_TOOLS,
    facts_for,
    forget_fact,
    namespace,
    read_facts,
    relevant_facts,
    remember_fact,
    update_fact,
)
from store import Writes
from store.documents import DocumentConflict
from tests.fakes.agent_rig import rig_factory
from tests.test_tools import make_ctx

SCOPE = "private:ana"


@pytest.fixture
async def make_rig(store, tmp_path):
    async with rig_factory(store, tmp_path) as make:
        yield make


@pytest.fixture
async def conv(store):
    return await store.ensure_conversation("slack:T:DANA", owner="ana", scope=SCOPE)


async def call(store, conv, fn, arguments: dict, *, commit: bool = True):
    writes = Writes()
    result = await fn.run(make_ctx(store=store, writes=writes, conversation_id=conv.id),
                          arguments)
    if commit and writes:
        await store.commit(writes)
    return result, writes


async def texts(store) -> list[tuple[int, str]]:
    return [(f["id"], f["text"]) for f in await read_facts(store, SCOPE)]


async def keep_old_facts(store, conv, *facts: str) -> None:
    """Facts as a build from before fact ids kept them."""
    w = Writes()
    w.edit_document(namespace(SCOPE), DOC, [{"op": "set", "path": ["items"], "value": [
        {"text": f, "since": "2024-01-01"} for f in facts]}], initial={"items": []},
        history="rewindable", fork_policy="current", conversation_id=conv.id)
    await store.commit(w)


async def test_remember_keeps_each_fact_once_with_a_number(store, conv):
    result, _ = await call(store, conv, remember_fact, {"fact": "  I'm   vegetarian "})
    assert result.content == "Facts now:\n1. I'm vegetarian"
    await call(store, conv, remember_fact, {"fact": "My sister lives in Graz"})
    again, writes = await call(store, conv, remember_fact, {"fact": "i'm vegetarian"})
    assert not writes and not again.is_error
    assert await texts(store) == [(1, "I'm vegetarian"), (2, "My sister lives in Graz")]
    empty, writes = await call(store, conv, remember_fact, {"fact": "   "})
    assert empty.is_error and not writes


async def test_update_fact_corrects_the_fact_with_that_number(store, conv):
    for fact in ("lives in Vienna", "likes tea", "has a cat"):
        await call(store, conv, remember_fact, {"fact": fact})
    await call(store, conv, forget_fact, {"number": 1})
    result, _ = await call(store, conv, update_fact, {"number": 3, "fact": "has two cats"})
    assert not result.is_error, result.content
    assert result.content == "Facts now:\n2. likes tea\n3. has two cats"
    doc = await store.read_document(namespace(SCOPE), DOC)
    [_, cats] = doc.value["items"]
    assert cats["id"] == 3 and cats["since"]
    # the same text again changes nothing; a number not kept is an error, and writes nothing
    _, writes = await call(store, conv, update_fact, {"number": 3, "fact": "has two cats"})
    assert not writes
    for number in (1, 4, 0):
        bad, writes = await call(store, conv, update_fact, {"number": number, "fact": "x"})
        assert bad.is_error and f"no fact number {number}" in bad.content, bad.content
        assert "numbers are 2, 3" in bad.content and not writes
    assert await texts(store) == [(2, "likes tea"), (3, "has two cats")]


async def test_forget_fact_forgets_that_fact_and_its_number_is_not_given_again(store, conv):
    for fact in ("a is 1", "b is 2", "c is 3"):
        await call(store, conv, remember_fact, {"fact": fact})
    result, _ = await call(store, conv, forget_fact, {"number": 3})
    assert result.content == "Facts now:\n1. a is 1\n2. b is 2"
    await call(store, conv, remember_fact, {"fact": "d is 4"})
    assert await texts(store) == [(1, "a is 1"), (2, "b is 2"), (4, "d is 4")]
    gone, writes = await call(store, conv, forget_fact, {"number": 3})
    assert gone.is_error and "no fact number 3" in gone.content and not writes
    for number in (1, 2, 4):
        await call(store, conv, forget_fact, {"number": number})
    assert await texts(store) == []
    none, _ = await call(store, conv, forget_fact, {"number": 1})
    assert none.is_error and "there are no facts" in none.content


async def test_facts_kept_before_numbers_get_them_as_they_were_shown(store, conv):
    await keep_old_facts(store, conv, "a is 1", "b is 2", "c is 3")
    assert await texts(store) == [(1, "a is 1"), (2, "b is 2"), (3, "c is 3")]
    assert await facts_for(store, conv.id, 1000) == "1. a is 1\n2. b is 2\n3. c is 3"
    await call(store, conv, forget_fact, {"number": 2})
    doc = await store.read_document(namespace(SCOPE), DOC)
    assert doc.value == {"items": [{"text": "a is 1", "since": "2024-01-01", "id": 1},
                                   {"text": "c is 3", "since": "2024-01-01", "id": 3}],
                         "next_id": 4}


async def test_a_fact_edit_from_a_stale_version_is_refused_and_its_rerun_is_right(
        store, conv):
    await keep_old_facts(store, conv, "a is 1", "b is 2", "c is 3", "d is 4")
    _, first = await call(store, conv, forget_fact, {"number": 2}, commit=False)
    _, second = await call(store, conv, forget_fact, {"number": 3}, commit=False)
    await store.commit(first)
    with pytest.raises(DocumentConflict):
        await store.commit(second)
    await call(store, conv, forget_fact, {"number": 3})  # the runtime's re-run
    assert await texts(store) == [(1, "a is 1"), (4, "d is 4")]


async def test_forgetting_two_facts_in_parallel_forgets_those_two(store, conv, make_rig):
    await keep_old_facts(store, conv, "a is 1", "b is 2", "c is 3", "d is 4")
    forget = Response(tool_calls=[
        ToolCall(id=f"f{n}", name="forget_fact", arguments={"number": n}) for n in (2, 3)])
    rig = make_rig(ScriptedModel([forget, Response(text="Forgotten.")]), *FACT_TOOLS)
    await rig.say("forget 2 and 3", session=conv.key)
    await rig.run()
    assert [f["text"] for f in await read_facts(store, SCOPE)] == ["a is 1", "d is 4"]
    assert await texts(store) == [(1, "a is 1"), (4, "d is 4")]
    log = await store.entries_page(conv.id, limit=50)
    assert [e.data["is_error"] for e in log if e.kind == "tool_result"] == [False, False]
    assert log[-1].text == "Forgotten."


# --- which facts reach the context ---------------------------------------------------------


def facts(*texts: str, first_id: int = 1) -> list[dict]:
    return [{"id": first_id + n, "text": t} for n, t in enumerate(texts)]


def test_relevant_facts_are_all_shown_by_number_when_they_fit():
    items = [{"id": 2, "text": "likes tea"}, {"id": 5, "text": "has a cat"}]
    assert relevant_facts(items, "", 1000) == "2. likes tea\n5. has a cat"
    exact = len("2. likes tea\n5. has a cat")
    assert relevant_facts(items, "", exact) == "2. likes tea\n5. has a cat"
    assert relevant_facts([], "anything", 10) == ""


def test_relevant_facts_choose_the_most_relevant_when_they_do_not_all_fit():
    items = facts("works at the bakery on Main Street",        # 1
                  "her sister Eva lives in Graz",               # 2
                  "allergic to peanuts",                        # 3
                  "drives a blue bicycle to work",              # 4
                  "Eva visits Graz every summer by train")      # 5
    said = "when does Eva come from Graz? remember the train"
    budget = len("2. her sister Eva lives in Graz\n5. Eva visits Graz every summer by train")
    # the two that share words with what was said, in the order they were kept
    assert relevant_facts(items, said, budget) == (
        "2. her sister Eva lives in Graz\n5. Eva visits Graz every summer by train")
    # nothing in common: the newest first
    assert relevant_facts(items, "hello", len("4. drives a blue bicycle to work\n"
                                              "5. Eva visits Graz every summer by train")
                          ) == "4. drives a blue bicycle to work\n5. Eva visits Graz every " \
                               "summer by train"


def test_a_relevant_fact_too_long_for_the_budget_does_not_keep_out_the_others():
    long = "Eva moved to Graz " + "x" * 300
    items = facts("Eva likes Graz", long, "tea with Eva", "the cat is named Graz")
    said = "Eva and Graz"
    shown = relevant_facts(items, said, 60)
    # the long one is among the most relevant, but does not fit: the next ones still do
    assert shown == "1. Eva likes Graz\n3. tea with Eva\n4. the cat is named Graz"
    assert len(shown) <= 60


async def test_facts_for_a_context_follow_what_was_said_lately(store, conv):
    for fact in ("works at the bakery", "her sister lives in Graz", "allergic to peanuts"):
        await call(store, conv, remember_fact, {"fact": fact})
    await call(store, conv, forget_fact, {"number": 1})
    w = Writes()
    w.append(conv.id, "user", "I am taking the train to see my sister in Graz")
    await store.commit(w)
    assert await facts_for(store, conv.id, 1000) == (
        "2. her sister lives in Graz\n3. allergic to peanuts")
    assert await facts_for(store, conv.id, 30) == "2. her sister lives in Graz"
