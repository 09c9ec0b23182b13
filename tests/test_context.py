"""Context assembly: the cached window is exactly the window an uncached read gives (after
appends, a moved head marker, withdrawals and budget changes), idle conversations leave
the cache, and the provider's reported usage sets the token estimate that decides when
compaction starts."""

import asyncio
import random

import httpx
import pytest

import bot.agent.context as context
from bot.agent.context import (
    CHARS_PER_TOKEN,
    WITHDRAWS,
    ContextCache,
    build_request,
    read_window,
    request_chars,
    tokens_per_char,
)
from bot.agent.inbox import submit_message
from bot.app.config import build_config
from bot.app.wiring import wire
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, Usage
from bot.runtime import RunnerOptions
from bot.tools import ToolBox
from store import Entry, Writes

OPTIONS = RunnerOptions(concurrency=4, retry_base_seconds=0.01, retry_max_seconds=0.02,
                        poll_seconds=0.02)


def shape(window):
    return (window.summary, window.cut_seq, [e.seq for e in window.entries],
            window.last_seq, window.chars, window.complete, window.marked)


async def write(store, conv_id, rows):
    w = Writes()
    for kind, body, data in rows:
        w.append(conv_id, kind, body, data=data, task_id="t" if kind == "user" else None)
    await store.commit(w)
    return await store.get_conversation_by_id(conv_id)


async def same(store, cache, conv_id, budget):
    conv = await store.get_conversation_by_id(conv_id)
    cached = await cache.window(store, conv, budget)
    fresh = await read_window(store, conv, budget)
    assert shape(cached) == shape(fresh)
    return cached


async def test_the_cached_window_is_the_uncached_window(store):
    rng = random.Random(7)
    conv = await store.ensure_conversation("cli:cache")
    cache = ContextCache()
    budget = 1500
    for _ in range(3):
        await write(store, conv.id, [("user", "u" * rng.randint(10, 200), None),
                                     ("assistant", "a" * rng.randint(10, 200), None)])
    await same(store, cache, conv.id, budget)
    for step in range(40):
        # appends of all sizes, the budget moving both ways (the estimate follows usage)
        quoted = "\n> someone else's line" if rng.random() < 0.3 else ""  # outside text
        conv = await write(store, conv.id, [
            ("user", f"q{step} " + "u" * rng.randint(10, 300) + quoted, None),
            ("aborted", "partial", None),
            ("assistant", f"a{step} " + "a" * rng.randint(10, 300),
             {"outside": "http_get"} if rng.random() < 0.2 else None)])
        budget = rng.choice([budget, budget, 900, 1500, 2600, 4000])
        await same(store, cache, conv.id, budget)
        if step % 7 == 3:  # a question taken back (its note comes later)
            conv = await write(store, conv.id, [("user", "take me back " + "w" * 150, None),
                                                ("system", "", None)])
            await same(store, cache, conv.id, budget)
            conv = await write(store, conv.id, [
                ("system", "(deleted)", {WITHDRAWS: [conv.last_seq - 1]})])
            await same(store, cache, conv.id, budget)
        if step % 11 == 5:  # an older message taken back, outside the cached window
            conv = await write(store, conv.id, [("system", "(deleted)", {WITHDRAWS: [2]})])
            await same(store, cache, conv.id, budget)
        if step % 13 == 9:  # compaction: the head marker moves
            conv = await write(store, conv.id, [("compaction", f"SUMMARY {step}",
                                                 {"cut_seq": conv.last_seq - 4})])
            w = Writes()
            w.append(conv.id, "compaction", f"SUMMARY {step}",
                     data={"cut_seq": conv.last_seq - 4}, head=True)
            await store.commit(w)
            window = await same(store, cache, conv.id, budget)
            assert window.summary == f"SUMMARY {step}"


async def test_a_withdrawal_lets_older_entries_back_into_a_full_window(store):
    conv = await store.ensure_conversation("cli:cache-withdraw")
    cache = ContextCache()
    for n in range(6):
        conv = await write(store, conv.id, [("user", f"q{n} " + "u" * 200, None),
                                            ("assistant", f"a{n} " + "a" * 200, None)])
    window = await same(store, cache, conv.id, 1000)
    assert not window.complete
    conv = await write(store, conv.id, [("user", "oops " + "w" * 300, None)])
    await same(store, cache, conv.id, 1000)
    conv = await write(store, conv.id, [("system", "(deleted)", {WITHDRAWS: [conv.last_seq]})])
    await same(store, cache, conv.id, 1000)
    # and a larger budget reads further back
    await same(store, cache, conv.id, 1800)


async def test_idle_conversations_leave_the_cache(store, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(context.time, "monotonic", lambda: clock[0])
    cache = ContextCache(max_conversations=3, idle_seconds=60)
    convs = []
    for n in range(4):
        c = await store.ensure_conversation(f"cli:idle{n}")
        convs.append(await write(store, c.id, [("user", f"hello {n}", None)]))
    await cache.window(store, convs[0], 1000)
    clock[0] += 30
    await cache.window(store, convs[1], 1000)
    assert len(cache) == 2
    clock[0] += 45  # conversation 0 has been idle for 75 s, conversation 1 for 45 s
    await cache.window(store, convs[2], 1000)
    assert len(cache) == 2 and convs[0].id not in cache._windows
    clock[0] += 61
    await cache.window(store, convs[3], 1000)
    assert len(cache) == 1  # every other one went idle
    for c in convs[:3]:  # and the cache never holds more than its maximum
        await cache.window(store, c, 1000)
    assert len(cache) == 3 and convs[3].id not in cache._windows


class Harness:
    def __init__(self, store, tmp_path, model, config):
        self.http = httpx.AsyncClient()
        app = wire(build_config(config, home=tmp_path), store, model, self.http,
                   toolbox=ToolBox(), options=OPTIONS)
        self.deps, self.runner = app.deps, app.runner
        self.store = store
        self.n = 0

    async def say(self, text, session="cli:est"):
        self.n += 1
        await submit_message(self.store, channel="cli", external_ids=[f"{session}:{self.n}"],
                             conversation_key=session, text=text)
        await asyncio.wait_for(self.runner.run(until_idle=True), 60)


@pytest.fixture
async def harnesses(store, tmp_path):
    made = []
    yield lambda model, config: made.append(Harness(store, tmp_path, model, config)) or made[-1]
    for h in made:
        await h.http.aclose()


def reporting(tokens_per_char_):
    """A model that reports `tokens_per_char_` input tokens per request character."""
    def reply(request):
        if "running summary" in request.messages[0].content:
            return Response(text="SUMMARY")
        return Response(text="ok", usage=Usage(
            input_tokens=int(request_chars(request) * tokens_per_char_)))
    return reply


async def test_reported_usage_sets_the_estimate(store, harnesses):
    config = {"compaction": {"enabled": False}}
    h = harnesses(ScriptedModel(reporting(0.5)), config)
    conv = await store.ensure_conversation("cli:est")
    assert await tokens_per_char(store, conv.id) == 1 / CHARS_PER_TOKEN
    before = await build_request(store, h.deps.config, conv.id, tools=[], model="m")
    await h.say("hello there")
    assert await tokens_per_char(store, conv.id) == pytest.approx(0.5, abs=0.01)
    after = await build_request(store, h.deps.config, conv.id, tools=[], model="m")
    chars = request_chars(after.request)
    assert after.estimated_tokens == pytest.approx(chars * 0.5, abs=2)
    assert before.estimated_tokens == pytest.approx(
        request_chars(before.request) / CHARS_PER_TOKEN, abs=2)


@pytest.mark.parametrize("ratio, compacts", [(0.25, False), (1.0, True)])
async def test_reported_usage_decides_when_compaction_starts(store, harnesses, ratio,
                                                             compacts):
    """The same history and window: a provider that counts a token every four characters
    leaves room; one that counts a token a character fills the window, and compaction
    starts."""
    config = {"llm": {"context_window": 3000, "max_output_tokens": 200},
              "compaction": {"reserve_tokens": 800, "keep_recent_tokens": 100}}
    h = harnesses(ScriptedModel(reporting(ratio)), config)
    conv = await store.ensure_conversation("cli:est")
    for n in range(8):
        await write(store, conv.id, [("user", f"question {n} " + "q" * 150, None),
                                     ("assistant", f"answer {n} " + "a" * 150, None)])
    await h.say("first")  # no usage reported yet: 1/3 token a character, room left
    assert not await store.list_tasks(kind="compact")
    await h.say("second")  # the first call's usage now sets the estimate
    assert bool(await store.list_tasks(kind="compact")) == compacts


async def test_the_cache_holds_at_most_its_bytes_and_counts_them_exactly(store):
    """The byte bound is what makes the cache's worst case a constant (a process runs for
    years; windows of a 128k-token model are megabytes each): what it says it holds is the
    sum of its windows' sizes, each at least what the window really references, through
    appends, a withdrawal and a trimmed window; over the bound the least recently used go,
    and a window larger than the whole bound is not kept."""
    from bench.soak import deep_size  # as the soak measures the cache
    from bot.agent.context import entry_bytes, window_bytes

    convs = []
    for n in range(4):
        c = await store.ensure_conversation(f"cli:bytes{n}")
        for k in range(5):
            c = await write(store, c.id, [("user", f"q{n}.{k} " + "u" * 300, None),
                                          ("assistant", f"a{n}.{k} " + "a" * 300,
                                           {"final": True, "answers_upto": k})])
        convs.append(c)
    probe = ContextCache()
    sizes = [window_bytes(await probe.window(store, c, 2500)) for c in convs]
    assert probe.held_bytes() == sum(sizes)

    cache = ContextCache(max_bytes=sizes[0] + sizes[1] + sizes[2] // 2)
    for c in convs[:3]:
        await cache.window(store, c, 2500)
    assert len(cache) == 2 and convs[0].id not in cache._windows  # the oldest went
    assert cache.held_bytes() <= cache.max_bytes

    # appends, a withdrawal, a trim to the budget: the count follows the entries held
    c = await write(store, convs[2].id, [("user", "more " + "m" * 900, None)])
    c = await write(store, c.id, [("system", "(deleted)", {WITHDRAWS: [c.last_seq]})])
    c = await write(store, c.id, [("user", "again " + "g" * 700, None)])
    window = await same(store, cache, c.id, 2500)
    assert not window.complete
    assert window.held == sum(entry_bytes(e) for e in window.entries)
    held = sum(size for *_rest, size in cache._windows.values())
    assert cache.held_bytes() == held <= cache.max_bytes
    for _, _, w, size in cache._windows.values():
        assert size >= deep_size(w)  # an upper bound of what the window references

    tiny = ContextCache(max_bytes=sizes[3] - 1)
    assert (await tiny.window(store, convs[3], 2500)).entries  # still answered
    assert len(tiny) == 0 and tiny.held_bytes() == 0


def test_each_entrys_message_is_made_once_and_the_memo_stays_small(monkeypatch):
    monkeypatch.setattr(context, "_MADE", type(context._MADE)())
    monkeypatch.setattr(context, "_MADE_MAX", 50)
    said = [Entry(i, 1, i, "user" if i % 2 else "assistant", None, f"line {i}", None, None,
                  None, 0.0) for i in range(1, 41)]
    long = Entry(99, 1, 99, "user", None, "x" * (context._MADE_TEXT + 1), None, None, None,
                 0.0)
    first = context.to_messages([*said, long])
    again = context.to_messages([*said, long])
    assert [m.content for m in again] == [m.content for m in first]
    assert all(a is b for a, b in zip(first[:-1], again[:-1], strict=True))
    assert again[-1] is not first[-1]  # a long one is made each time, never kept
    # An equal entry that is another object gets a message of its own: the memo is by
    # object, so another store's entry with the same id is never mistaken for it.
    twin = Entry(1, 1, 1, "user", None, "line 1 elsewhere", None, None, None, 0.0)
    assert context.to_messages([twin])[0].content == "line 1 elsewhere"
    context.to_messages([Entry(i, 2, i, "user", None, "more", None, None, None, 0.0)
                         for i in range(100)])
    assert len(context._MADE) == 50


async def test_an_oversized_message_is_cut_with_a_note(store, harnesses):
    """The newest message is always in the window, but never whole when it alone is larger
    than the window: a 5 MB paste once became one 5,000,501-character request."""
    model = ScriptedModel(lambda request: Response(text="ok"))
    h = harnesses(model, {"llm": {"context_window": 32000, "max_output_tokens": 1000},
                          "compaction": {"enabled": False}})
    await h.say("x" * 5_000_000)
    [request] = model.requests
    budget = (32000 - 1000) * CHARS_PER_TOKEN
    assert request_chars(request) < budget, request_chars(request)
    said = request.messages[-1].content
    assert said.startswith("xxx") and "characters of this message are not shown" in said
    # Kept whole in the transcript: only the request is cut.
    [entry] = [e for e in await store.entries_page(
        (await store.get_conversation("cli:est")).id) if e.kind == "user"]
    assert len(entry.text) == 5_000_000
