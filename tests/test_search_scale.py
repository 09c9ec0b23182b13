"""Full-history search whose cost must not follow the size of the history: a scope's or a
conversation's search walks that scope, not everyone's matches, and PostgreSQL phrase
queries pick their plan from the data, not from the planner's guess. Every test runs on
SQLite and PostgreSQL."""

import pytest
from sqlalchemy import text

from store import search as search_module
from store.engine import create_engines
from store.search import explain
from tests.test_search import BULK, NOW, ROWS, say, texts


async def test_a_common_word_in_a_small_scope_does_not_walk_everyones_matches(store,
                                                                               store_url):
    erin = await store.ensure_conversation("slack:T:D-erin", owner="erin")
    await say(store, erin, "lunch with erin on monday", "lunch again", at=NOW - 400 * 86400)
    big = await store.ensure_conversation("cli:big", owner="dana")
    engines = create_engines(store_url)
    try:
        async with engines.write.begin() as conn:  # 200 000 entries, each one "about lunch"
            await conn.execute(text(BULK[engines.dialect]), {"cid": big.id})
            await conn.execute(text("UPDATE conversations SET last_seq = :n WHERE id = :cid"),
                               {"n": ROWS, "cid": big.id})
            await conn.execute(text("ANALYZE"))
        async with engines.read.connect() as conn:
            small = await explain(conn, engines.dialect, "lunch", scopes=["private:erin"])
            whole = await explain(conn, engines.dialect, "lunch", scopes=["private:dana"])
    finally:
        await engines.dispose()
    if engines.dialect == "sqlite":
        # the matches are tested against erin's entry ids, within their id range
        assert "COVERING INDEX ix_entries_conversation_id" in small, small
        assert "INDEX 192:M1><" in small, small
        assert "ix_entries_conversation_id" not in whole, whole  # dense: the plain walk
    else:
        # planned with the conversation's own statistics: erin's two entries by index; the
        # big conversation walked newest first and cut at the window, never sorted whole
        assert "ix_entries_conversation_id" in small and "Seq Scan" not in small, small
        assert "Index Scan Backward" in whole and "Sort Key: e.id" not in whole, whole
    assert sorted(await texts(store, "lunch", scopes=["private:erin"])) == [
        "lunch again", "lunch with erin on monday"]
    hits = await store.search("lunch", scopes=["private:dana"], limit=3, at=NOW)
    # the newest users' (each read with its neighbours, which match too)
    assert hits[0].entry.seq == ROWS and all(h.entry.seq > ROWS - 10 for h in hits)


WHOLE = 10_000  # a scope that is the whole history, below the 40,000 the rule once allowed


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # a SQLite plan choice
async def test_a_scope_that_is_the_whole_history_is_not_filtered_by_its_ids_per_term(
        store, store_url):
    """Each term's branch collects the sparse plan's scope ids for itself and holds them to
    the statement's end: a many-word question in a scope that is all there is must walk the
    index instead (the sparse test is per term's window, not the whole window)."""
    conv = await store.ensure_conversation("cli:all", owner="dana")
    engines = create_engines(store_url)
    try:
        async with engines.write.begin() as conn:
            await conn.execute(text(BULK["sqlite"].replace(str(ROWS), str(WHOLE))),
                               {"cid": conv.id})
            await conn.execute(text("UPDATE conversations SET last_seq = :n WHERE id = :cid"),
                               {"n": WHOLE, "cid": conv.id})
        async with engines.read.connect() as conn:
            many = await explain(conn, "sqlite", "note lunch about zeppelin monday",
                                 scopes=["private:dana"])
    finally:
        await engines.dispose()
    assert "SCAN entries_fts VIRTUAL TABLE" in many, many
    assert "ix_entries_conversation_id" not in many, many  # no id list per term
    hits = await store.search("note lunch about zeppelin monday", scopes=["private:dana"],
                              limit=3, at=NOW)
    assert len(hits) == 3


async def test_a_rare_phrase_of_common_words_is_found_on_every_plan(store, monkeypatch):
    conv = await store.ensure_conversation("cli:phrase")
    await say(store, conv, "the red bicycle is in the shed", "a red bicycle for sale",
              at=NOW - 300 * 86400)
    await say(store, conv, *[f"bicycle {i} painted red" for i in range(40)])
    for probe_rows in (2000, 5):  # the whole scope sampled; a sample that sees no phrase
        monkeypatch.setattr(search_module, "PROBE_ROWS", probe_rows)
        assert await texts(store, '"red bicycle"') == [
            "a red bicycle for sale", "the red bicycle is in the shed"]
        assert await texts(store, '"red bicycle"', conversation_key="cli:phrase") == [
            "a red bicycle for sale", "the red bicycle is in the shed"]
