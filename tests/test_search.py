"""Full-history search: ranking, paging, neighbours, scoping, hostile queries, CJK and
German text, the migration's backfill, the plan (answered from the index, never a scan),
the agent's `search_history` tool and `steward search`. Every test runs on SQLite and
PostgreSQL."""

import json
import types

import pytest
from sqlalchemy import text

from bot.app.config import build_config
from bot.memory.search import search_command, search_history
from bot.tools import ToolContext
from store import Writes, hybrid, open_store
from store.engine import create_engines, migrate
from store.search import MAX_EXPANSION, explain, parse_query
from store.search import search as search_on

DAY = 86400.0
NOW = 1_800_000_000.0  # a pinned clock: recency is measured from here


async def say(store, conversation, *entries, at: float = NOW - DAY) -> None:
    """Append entries, each `text` (a user message) or `(kind, text)` or a dict of
    `Writes.append` arguments, in one commit."""
    w = Writes()
    for item in entries:
        if isinstance(item, str):
            item = {"kind": "user", "text": item}
        elif isinstance(item, tuple):
            item = {"kind": item[0], "text": item[1]}
        item = {"created_at": at, **item}
        w.append(conversation.id, item.pop("kind"), item.pop("text"), **item)
    await store.commit(w)


async def texts(store, query: str, **kwargs) -> list[str]:
    return [h.entry.text for h in await store.search(query, at=NOW, **kwargs)]


async def filler(store, conversation, n: int = 12) -> None:
    """Unrelated chatter, so that the words under test are rare (as in a real history)."""
    await say(store, conversation, *[f"small talk number {i} about the weather" for i in
                                     range(n)], at=NOW - 30 * DAY)


def tool_context(store, conversation) -> ToolContext:
    return ToolContext(store=store, task_id="T1", conversation_id=conversation.id,
                       conversation_key=conversation.key, http=None, timezone="UTC")


# --- ranking -------------------------------------------------------------------------------


async def test_an_exact_phrase_beats_scattered_terms(store):
    conv = await store.ensure_conversation("cli:ranking")
    await filler(store, conv)
    await say(store, conv, "the bicycle in the shed is red and old",
              "the old red bicycle is in the shed")
    assert await texts(store, "red bicycle") == [
        "the old red bicycle is in the shed", "the bicycle in the shed is red and old"]
    assert await texts(store, '"red bicycle"') == ["the old red bicycle is in the shed"]


async def test_a_recent_message_beats_an_equally_relevant_old_one(store):
    conv = await store.ensure_conversation("cli:recency")
    await filler(store, conv)
    await say(store, conv, "the dentist appointment is on monday", at=NOW - 2 * DAY)
    await say(store, conv, "the dentist appointment is on friday", at=NOW - 700 * DAY)
    assert await texts(store, "dentist appointment") == [
        "the dentist appointment is on monday", "the dentist appointment is on friday"]
    hits = await store.search("dentist", at=NOW)
    assert hits[0].score > hits[1].score > 0.5 * hits[0].score  # old, not forgotten


async def test_stewards_own_output_is_no_evidence_unless_asked_for(store):
    conv = await store.ensure_conversation("cli:speaker")
    await filler(store, conv)
    await say(store, conv, "my passport number is X1234567",
              ("tool_result", "passport number X1234567 confirmed"),
              {"kind": "assistant", "text": "your passport number X1234567 is noted",
               "task_id": "turn-1"},
              {"kind": "user", "text": "Reminder: renew the passport", "author": "scheduler"},
              ("assistant", "Imported: my old passport number was X7654321"))
    found = await store.search("passport number", at=NOW)
    # what people said (an imported assistant entry has no turn: someone said it), never
    # the tool's output, Steward's answer or a reminder's message
    assert [h.entry.text for h in found][:2] == [
        "my passport number is X1234567", "Imported: my old passport number was X7654321"]
    assert all(h.entry.kind != "tool_result" and h.entry.task_id is None
               and h.entry.author != "scheduler" for h in found)
    asked = await hybrid.find(store, "passport number", at=NOW, answers=True)
    assert "your passport number X1234567 is noted" in [h.entry.text for h in asked]
    assert all(h.entry.kind != "tool_result" for h in asked)


async def test_a_search_finds_what_was_said_not_earlier_searches_for_it(store):
    conv = await store.ensure_conversation("cli:climbing")
    await filler(store, conv)
    await say(store, conv, {"kind": "user", "text": "I went to the new climbing gym on "
                            "Saturday with my sister, my arms are dead", "task_id": "t1"},
              {"kind": "assistant", "text": 'You said: "I went to the new climbing gym"',
               "task_id": "t1"})
    for turn in ("t2", "t3"):  # "search for climbing", twice
        await say(store, conv, {"kind": "user", "text": "search for climbing",
                                "task_id": turn},
                  {"kind": "tool_result", "text": "1. user: I went to the new climbing gym",
                   "task_id": turn, "data": {"name": "search_history"}},
                  {"kind": "assistant", "text": "I found: I went to the new climbing gym",
                   "task_id": turn})
    found = await store.search("climbing", at=NOW)
    assert found[0].entry.text.startswith("I went to the new climbing gym on Saturday")
    assert [h.entry.text for h in found[1:]] == ["search for climbing"] * 2
    assert found[1].score < 0.5 * found[0].score


async def test_only_searchable_kinds_are_found(store):
    conv = await store.ensure_conversation("cli:kinds")
    await say(store, conv, ("aborted", "zanzibar half an answer"),
              ("system", "zanzibar rules"), ("compaction", "summary: zanzibar trip planned"),
              {"kind": "tool_result", "text": "earlier: zanzibar",
               "data": {"name": "search_history", "tool_call_id": "c1", "is_error": False}})
    assert await texts(store, "zanzibar") == []  # a summary is Steward's: asked for only
    asked = await hybrid.find(store, "zanzibar", at=NOW, answers=True)
    assert [h.entry.text for h in asked] == ["summary: zanzibar trip planned"]


# --- paging and neighbours -----------------------------------------------------------------


async def test_pages_cover_every_hit_once(store):
    conv = await store.ensure_conversation("cli:paging")
    await say(store, conv, *[f"invoice {i} for the garden work" for i in range(25)])
    seen = []
    for offset in (0, 10, 20, 30):
        page = await store.search("invoice garden", limit=10, offset=offset, at=NOW)
        assert len(page) == {0: 10, 10: 10, 20: 5, 30: 0}[offset]
        seen += [h.entry.id for h in page]
    assert len(seen) == len(set(seen)) == 25


async def test_a_word_found_everywhere_ranks_only_its_newest_matches(store, store_url):
    conv = await store.ensure_conversation("cli:window")
    await say(store, conv, *[f"ok number {i}" for i in range(30)])
    newest = {e.id for e in await store.entries_page(conv.id, limit=10)}
    engines = create_engines(store_url)
    try:
        async with engines.read.connect() as conn:
            hits = await search_on(conn, engines.dialect, "ok", scopes=None,
                                   conversation_id=None, limit=50, offset=0, now=NOW,
                                   candidates=10)
    finally:
        await engines.dispose()
    assert {h.entry.id for h in hits} == newest


async def test_hits_come_with_their_neighbours(store):
    conv = await store.ensure_conversation("cli:neighbours")
    await say(store, conv, "what was the wifi password again?",
              ("assistant", ""),  # a turn that only called a tool: nothing to read
              ("aborted", "half an ans"),
              ("assistant", "The wifi password is tulip-42."),
              "thanks", ("assistant", "you're welcome"), "bye")
    [hit] = await store.search("tulip", at=NOW)
    assert hit.conversation_key == "cli:neighbours"
    assert [e.text for e in hit.before] == ["what was the wifi password again?"]
    assert [e.text for e in hit.after] == ["thanks"]
    [wide] = await store.search("tulip", context=2, at=NOW)
    assert [e.text for e in wide.after] == ["thanks", "you're welcome"]
    [alone] = await store.search("tulip", context=0, at=NOW)
    assert (alone.before, alone.after) == ((), ())


async def test_a_single_conversation(store):
    one = await store.ensure_conversation("cli:one")
    other = await store.ensure_conversation("cli:other")
    await say(store, one, "the boiler makes a noise")
    await say(store, other, "the boiler was serviced")
    assert await texts(store, "boiler", conversation_key="cli:one") == [
        "the boiler makes a noise"]
    assert len(await texts(store, "boiler")) == 2


# --- scoping -------------------------------------------------------------------------------


async def test_what_a_person_said_privately_stays_in_their_scope(store):
    alice = await store.ensure_conversation("slack:T:D-alice", owner="alice")
    bob = await store.ensure_conversation("slack:T:D-bob", owner="bob")
    general = await store.ensure_conversation("slack:T:C-general", owner="alice",
                                              scope="channel:C-general")
    random = await store.ensure_conversation("slack:T:C-random", owner="bob",
                                             scope="channel:C-random")
    await say(store, alice, "my locker code is 4711")
    await say(store, bob, "where is my locker?")
    await say(store, general, "the locker room is on floor 2")
    assert alice.scope == "private:alice"
    assert await texts(store, "locker", scopes=["private:alice"]) == ["my locker code is 4711"]
    assert await texts(store, "locker", scopes=["private:bob"]) == ["where is my locker?"]
    # any word counts (0008): bob's own "locker", never alice's 4711
    assert await texts(store, "locker 4711", scopes=["private:bob"]) == [
        "where is my locker?"]
    assert await texts(store, "locker", scopes=["channel:C-general"]) == [
        "the locker room is on floor 2"]
    assert await texts(store, "locker", scopes=[random.scope]) == []
    assert await texts(store, "locker", scopes=[]) == []
    assert len(await texts(store, "locker")) == 3  # no restriction: the owner's CLI

    for conv, visible in ((bob, "where is my locker?"),
                          (general, "the locker room is on floor 2")):
        result = await search_history.run(tool_context(store, conv), {"query": "locker"})
        assert visible in result.content
        assert "4711" not in result.content
    result = await search_history.run(tool_context(store, random), {"query": "locker"})
    assert result.content == "No matches for 'locker'."


async def test_the_question_being_answered_is_not_its_own_search_hit(store):
    """The model searching while it answers finds what was said before, not the question
    it is answering (that is in its context already), however well it matches."""
    conv = await store.ensure_conversation("cli:asking")
    await filler(store, conv)
    await say(store, conv, "I went climbing at the new gym with Anna", at=NOW - 40 * DAY)
    w = Writes()
    turn = w.spawn("turn", {}, conversation_id=conv.id)
    w.append(conv.id, "user", "when did I go climbing at the gym with Anna?", task_id=turn,
             created_at=NOW)
    call = w.spawn("tool_call", {}, parent_id=turn, conversation_id=conv.id)
    await store.commit(w)
    ctx = ToolContext(store=store, task_id=call, conversation_id=conv.id,
                      conversation_key=conv.key, http=None, timezone="UTC")
    result = await search_history.run(ctx, {"query": "climbing gym Anna"})
    assert "I went climbing at the new gym with Anna" in result.content
    assert "when did I go climbing" not in result.content


# --- query syntax --------------------------------------------------------------------------


HOSTILE = ['"', '""', '"""', "*", "**", "NEAR", "NEAR(a b, 2)", "a OR b", "AND", "NOT x",
           "-x", "text:x", "^x", "(", ")", "{a b}", "'", "\\", "%", "_", 'a"b', '"unbalanced',
           "x*", ":*", "&|!<->", "a & b | !c", "饺\"", "'; DROP TABLE entries; --", "\x00",
           "a" * 3000, " ".join(["w"] * 100), "∞ ✓ 🙂"]


async def test_hostile_queries_are_words_never_syntax(store):
    conv = await store.ensure_conversation("cli:hostile")
    await say(store, conv, 'he wrote "NEAR" and x* in the config: a OR b',
              "the % and _ signs")
    for query in HOSTILE:
        await store.search(query, at=NOW)  # never raises
    assert await texts(store, "NEAR") == ['he wrote "NEAR" and x* in the config: a OR b']
    assert await texts(store, '"a OR b"') == ['he wrote "NEAR" and x* in the config: a OR b']
    # NOT is a (stop) word, not an operator: "config" still finds its entry (0008: any
    # word counts, so NOT cannot make the query fail either)
    assert await texts(store, "NOT config") == [
        'he wrote "NEAR" and x* in the config: a OR b']
    assert await texts(store, "%") == []  # punctuation alone matches nothing
    assert await texts(store, "signs _") == ["the % and _ signs"]


def test_the_query_parser():
    assert parse_query('  plain words "an exact  phrase" "unbalanced end') == [
        parse_query("plain")[0], parse_query("words")[0],
        *parse_query('"an exact phrase"'), *parse_query('"unbalanced end"')]
    assert [t.text for t in parse_query('(x) "" *** Word word')] == ["x", "Word"]
    assert [t.cjk for t in parse_query("饺子 bike 東京 서울")] == [True, False, True, True]


# --- languages -----------------------------------------------------------------------------


async def test_chinese_japanese_and_korean_substrings(store):
    conv = await store.ensure_conversation("cli:cjk")
    await say(store, conv, "我想吃饺子", "北京烤鸭很好吃", "今天开会了", "東京タワーに行きました",
              "서울에서 만나요", "meeting about 饺子 recipes")
    assert set(await texts(store, "饺子")) == {"我想吃饺子", "meeting about 饺子 recipes"}
    assert await texts(store, "吃饺子") == ["我想吃饺子"]
    assert await texts(store, "饺") == await texts(store, "饺子")  # one character
    assert await texts(store, "烤鸭") == ["北京烤鸭很好吃"]
    assert await texts(store, "北京烤鸭") == ["北京烤鸭很好吃"]
    assert sorted(await texts(store, "吃")) == ["北京烤鸭很好吃", "我想吃饺子"]
    assert await texts(store, "タワー") == ["東京タワーに行きました"]
    assert await texts(store, "서울") == ["서울에서 만나요"]
    # any term counts (0008): the entry with both first
    assert await texts(store, "饺子 recipes") == ["meeting about 饺子 recipes", "我想吃饺子"]
    assert set(await texts(store, "饺子 北京")) == {"我想吃饺子", "北京烤鸭很好吃",
                                                  "meeting about 饺子 recipes"}
    assert set(await texts(store, '"饺子" 北京')) == {"我想吃饺子", "meeting about 饺子 recipes"}
    assert await texts(store, "上海") == []


async def test_a_very_common_cjk_character_still_finds_its_entries(store):
    conv = await store.ensure_conversation("cli:cjk-common")
    # more distinct trigrams start with 饺 than a query may expand to: a LIKE filter instead
    await say(store, conv, *[f"饺{chr(0x4e00 + i)}好" for i in range(MAX_EXPANSION + 1)])
    await say(store, conv, "我想吃饺")  # at the very end of a text
    found = [h.entry.text for h in await store.search("饺", limit=2000, at=NOW)]
    assert len(found) == MAX_EXPANSION + 2 and "我想吃饺" in found


async def test_german_umlauts_and_case(store):
    conv = await store.ensure_conversation("cli:deutsch")
    await say(store, conv, "Die Größe der Wohnung in München", "Über den Wolken",
              "Herr MÜLLER ruft an", "Grüße aus der Straße")
    assert await texts(store, "größe") == ["Die Größe der Wohnung in München"]
    assert await texts(store, "münchen") == ["Die Größe der Wohnung in München"]
    assert await texts(store, "Munchen") == ["Die Größe der Wohnung in München"]
    assert await texts(store, "über") == ["Über den Wolken"]
    assert await texts(store, "müller") == ["Herr MÜLLER ruft an"]
    assert await texts(store, "straße grüße") == ["Grüße aus der Straße"]


# --- the migration -------------------------------------------------------------------------


async def test_rows_written_before_the_search_migration_are_found(store_url):
    engines = create_engines(store_url)
    try:
        await migrate(engines, "0003")  # a database from the release before search
        async with engines.write.begin() as conn:
            await conn.execute(text(
                "insert into conversations (key, owner, scope, last_seq, meta, created_at,"
                " updated_at) values ('slack:T:D-old', 'carla', 'private:carla', 4, '{}', 0,"
                " 0)"))
            await conn.execute(text(
                "insert into entries (conversation_id, seq, kind, text, data, created_at)"
                " select id, s.seq, s.kind, s.text, s.data, 1500000000 from conversations,"
                " (select 1 as seq, 'user' as kind, 'we climbed the Zugspitze' as text,"
                "  null as data union all"
                "  select 2, 'assistant', '去年的饺子很好吃 Zugspitze', null union all"
                "  select 3, 'system', 'Zugspitze system note', null union all"
                "  select 4, 'tool_result', 'Zugspitze again', '{\"name\":\"search_history\"}'"
                " ) as s"))
    finally:
        await engines.dispose()
    store = await open_store(store_url)  # upgrades to head, indexing what was there
    try:
        assert set(await texts(store, "zugspitze")) == {"we climbed the Zugspitze",
                                                        "去年的饺子很好吃 Zugspitze"}
        assert await texts(store, "饺子", scopes=["private:carla"]) == [
            "去年的饺子很好吃 Zugspitze"]
        conv = await store.get_conversation("slack:T:D-old")
        await say(store, conv, "and the Zugspitze again")  # new rows are indexed too
        assert len(await texts(store, "zugspitze")) == 3
    finally:
        await store.close()


# --- the plan: answered from the index -----------------------------------------------------


ROWS = 200_000
BULK = {
    "sqlite": f"""
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {ROWS})
        INSERT INTO entries (conversation_id, seq, kind, author, text, created_at)
        SELECT :cid, i, CASE i % 3 WHEN 0 THEN 'assistant' ELSE 'user' END, 'dana',
               'note ' || i || CASE WHEN i = 123456 THEN ' zeppelin' ELSE ' about lunch' END,
               1700000000 + i FROM n""",
    "postgresql": f"""
        INSERT INTO entries (conversation_id, seq, kind, author, text, created_at)
        SELECT :cid, i, CASE i % 3 WHEN 0 THEN 'assistant' ELSE 'user' END, 'dana',
               'note ' || i || CASE WHEN i = 123456 THEN ' zeppelin' ELSE ' about lunch' END,
               1700000000 + i FROM generate_series(1, {ROWS}) AS i""",
}


async def test_a_search_over_a_big_conversation_reads_the_index_not_the_table(store,
                                                                                store_url):
    conv = await store.ensure_conversation("cli:big", owner="dana")
    engines = create_engines(store_url)
    try:
        async with engines.write.begin() as conn:
            await conn.execute(text(BULK[engines.dialect]), {"cid": conv.id})
            await conn.execute(text("UPDATE conversations SET last_seq = :n WHERE id = :cid"),
                               {"n": ROWS, "cid": conv.id})
            await conn.execute(text("ANALYZE"))
        async with engines.read.connect() as conn:
            for kwargs in ({}, {"scopes": ["private:dana"]}, {"conversation_id": conv.id}):
                plan = await explain(conn, engines.dialect, "zeppelin", **kwargs)
                if engines.dialect == "sqlite":
                    assert "SCAN entries_fts VIRTUAL TABLE" in plan, plan
                    assert "SEARCH e USING INTEGER PRIMARY KEY" in plan, plan
                    assert "SCAN e " not in plan and "SCAN c " not in plan, plan
                else:
                    assert "Bitmap Index Scan on ix_entries_search" in plan, plan
                    assert "Seq Scan on entries" not in plan, plan
                    assert "Index Scan using uq_entries_conversation_seq" not in plan, plan
    finally:
        await engines.dispose()
    hit = (await store.search("zeppelin", scopes=["private:dana"], at=NOW))[0]
    assert (hit.entry.seq, [e.seq for e in hit.before], [e.seq for e in hit.after]) == (
        123456, [123455], [123457])


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)  # a PostgreSQL planner matter
async def test_postgresql_plans_every_search_for_its_own_words(store_url):
    """asyncpg prepares statements; a generic plan (PostgreSQL's choice after five runs)
    cannot use the index selectivity of this query's words."""
    store = await open_store(store_url)
    try:
        conv = await store.ensure_conversation("cli:plans")
        await say(store, conv, "plan one", "plan two")
        for _ in range(8):
            assert len(await store.search("plan", at=NOW)) == 2
        engines = create_engines(store_url)
        try:
            async with engines.read.connect() as conn:
                for _ in range(8):
                    await search_on(conn, "postgresql", "plan", scopes=None,
                                    conversation_id=None, limit=5, offset=0, now=NOW)
                [(generic, custom)] = (await conn.execute(text(
                    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                    "WHERE statement LIKE 'SELECT w.id AS id, %'"))).all()
        finally:
            await engines.dispose()
        assert (generic, custom) == (0, 8)
    finally:
        await store.close()


# --- the tool and the CLI ------------------------------------------------------------------


async def test_the_tool_shows_date_place_speaker_and_neighbours_and_pages(store):
    conv = await store.ensure_conversation("slack:T:D-erin", owner="erin")
    await say(store, conv, {"kind": "user", "text": "I am allergic to peanuts",
                            "author": "erin"},
              ("assistant", "Noted: no peanuts. " + "Details follow. " * 80),
              {"kind": "tool_result", "text": "peanut-free recipes: 3 found",
               "data": {"name": "http_get"}}, at=1_700_000_000.0)
    ctx = tool_context(store, conv)
    result = await search_history.run(ctx, {"query": "peanuts", "limit": 1})
    assert not result.is_error
    lines = result.content.splitlines()
    assert lines[0] == "Results 1-1 for 'peanuts', best first:"
    assert lines[1] == "1. Tue 2023-11-14 22:13 UTC · slack:T:D-erin · #1"
    assert lines[2] == "   > user (erin): I am allergic to peanuts"
    assert lines[3].startswith("   … assistant: Noted: no peanuts. Details follow.")
    assert lines[3].endswith("…") and len(lines[3]) < 200
    assert lines[4] == "(More may match: page=2.)"

    # the tool's output is no evidence: it is neither found nor shown as a neighbour
    second = await search_history.run(ctx, {"query": "peanuts", "limit": 1, "page": 2})
    assert "2. Tue 2023-11-14 22:13 UTC · slack:T:D-erin · #2" in second.content
    assert "   … user (erin): I am allergic to peanuts" in second.content
    assert "peanut-free" not in second.content
    assert (await search_history.run(ctx, {"query": "peanuts", "limit": 1, "page": 3})
            ).content == "No more matches for 'peanuts' (page 3)."
    too_many = await search_history.run(ctx, {"query": "peanuts", "limit": 50})
    assert too_many.is_error and "limit" in too_many.content
    nowhere = ToolContext(store=store, task_id="T2", http=None)
    assert (await search_history.run(nowhere, {"query": "peanuts"})).content == \
        "error: search_history needs a conversation"


async def test_steward_search_prints_the_json_contract(store_url, tmp_path, capsys):
    store = await open_store(store_url)
    try:
        conv = await store.ensure_conversation("email:<m1@example.org>", owner="fay")
        await say(store, conv, {"kind": "user", "text": "the roof leaks again",
                                "author": "fay", "ref": "<m1@example.org>"},
                  ("assistant", "I will call the roofer."), at=1_700_000_000.0)
    finally:
        await store.close()
    config = build_config({"store": {"url": store_url}}, home=tmp_path)
    args = types.SimpleNamespace(query=["roof", "leaks"], session=None, limit=5, json=True)
    assert await search_command(config, args) == 0
    [line] = capsys.readouterr().out.splitlines()
    row = json.loads(line)
    assert {k: row[k] for k in ("session", "entry", "role", "author", "text", "ts", "ref")} \
        == {"session": "email:<m1@example.org>", "entry": 1, "role": "user", "author": "fay",
            "text": "the roof leaks again", "ts": "2023-11-14T22:13:20+00:00",
            "ref": "<m1@example.org>"}
    assert row["score"] > 0 and row["after"][0]["text"] == "I will call the roofer."

    args = types.SimpleNamespace(query="roofer", session="email:<m1@example.org>", limit=None,
                                 json=False)
    assert await search_command(config, args) == 0
    out = capsys.readouterr().out
    assert "email:<m1@example.org> #2" in out and "  > [2] assistant: I will call the roofer." \
        in out
