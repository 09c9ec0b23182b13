"""Automatic recall (bot/memory/recall.py): the newest message as a whole goes through the
ranked search, the best few hits come back in bounded text, what the window holds is
skipped, and the scope rules are the search's. Every test runs on SQLite and PostgreSQL."""

from bot.memory import recall as recall_module
from bot.memory.recall import recall, worth_searching
from store import Writes

DAY = 86400.0
TARGET = "I finally went to the new climbing gym on Saturday, my arms are dead"


async def said(store, conv, *rows, at=1_700_000_000.0):
    """Append (author, text) rows as user messages; returns their entry ids."""
    w = Writes()
    for author, body in rows:
        w.append(conv.id, "user", body, author=author, created_at=at)
    await store.commit(w)
    return sorted(e.id for e in await store.entries_page(conv.id, limit=len(rows)))


async def compacted(store, key, owner="me"):
    """A conversation whose window has lost history already (recall only runs then)."""
    conv = await store.ensure_conversation(key, owner=owner)
    await said(store, conv, ("me", "hello"))
    w = Writes()
    w.append(conv.id, "compaction", "SUMMARY", data={"cut_seq": 1}, head=True)
    await store.commit(w)
    return await store.get_conversation(key)


async def test_the_whole_message_is_searched_not_three_words(store):
    """The three longest words of "Has Anna climbed anything lately?" are "anything",
    "climbed", "lately": none of them occurs in what Anna said. The whole message, stemmed
    and with the speaker's name, finds it."""
    here = await compacted(store, "cli:now")
    old = await store.ensure_conversation("cli:march", owner="me")
    await said(store, old, ("Anna", TARGET), ("Bob", "the weather was awful all week"),
               ("Bob", "my brother is in the Alps"))
    found = await recall(store, here, "Has Anna climbed anything lately?", in_window=set())
    assert found.splitlines() == [f"- 2023-11-14 Anna: {TARGET}",  # and the turn after it
                                  "  … Bob: the weather was awful all week"]


async def test_the_window_other_scopes_and_weak_matches_are_left_out(store):
    here = await compacted(store, "cli:now")
    old = await store.ensure_conversation("cli:old", owner="me")
    ids = await said(store, old, ("me", "the zeppelin museum in friedrichshafen opens at nine"),
                     ("me", "the zeppelin museum shop sells posters"),
                     *[("me", f"the bakery opens at {h}") for h in range(6, 12)])
    elsewhere = await store.ensure_conversation("slack:T:D-zoe", owner="zoe")
    await said(store, elsewhere, ("zoe", "my zeppelin museum secret is 4711"))
    message = "When does the zeppelin museum open?"
    found = await recall(store, here, message, in_window=set())
    # both museum lines, each once (one may be the other's neighbour); the bakery's weak
    # match is no hit of its own, and zoe's scope is not searched
    lines = found.splitlines()
    assert all("zeppelin" in line for line in lines if line.startswith("- "))
    assert sum("friedrichshafen" in line for line in lines) == 1
    assert sum("posters" in line for line in lines) == 1
    assert "4711" not in found
    found = await recall(store, here, message, in_window={ids[0]})
    assert found.splitlines()[0] == "- 2023-11-14 me: the zeppelin museum shop sells posters"
    assert "friedrichshafen" not in found  # the window holds it: not even as a neighbour
    zoe = await compacted(store, "slack:T:D-zoe2", owner="zoe")
    assert "4711" in await recall(store, zoe, message, in_window=set())
    assert "friedrichshafen" not in await recall(store, zoe, message, in_window=set())


async def test_recall_fills_the_room_it_is_given(store):
    here = await compacted(store, "cli:now")
    old = await store.ensure_conversation("cli:old", owner="me")
    long = "blah " * 300 + "the kayak is in the garage " + "blah " * 300
    await said(store, old, *[("me", f"{long} number {i}") for i in range(8)])
    found = await recall(store, here, "where is the kayak?", in_window=set())
    lines = found.splitlines()
    assert all("kayak" in line and len(line) < recall_module.HIT_CHARS + 40 for line in lines)
    assert 2 <= len(lines) and len(found) <= recall_module.MAX_CHARS
    assert len((await recall(store, here, "where is the kayak?", in_window=set(),
                             room=500)).splitlines()) == 1
    more = await recall(store, here, "where is the kayak?", in_window=set(), room=20_000)
    assert len(more.splitlines()) == 8  # every kayak, each once


async def test_history_beyond_the_window_is_recalled_before_any_compaction(store):
    imported = await store.ensure_conversation("slack:T:C-import", owner="me")
    ids = await said(store, imported, ("Anna", TARGET), ("Bob", "nice, which gym?"),
                     *[("Bob", f"small talk {i}") for i in range(20)])
    imported = await store.get_conversation("slack:T:C-import")
    assert not imported.head_seq  # never compacted
    window = set(ids[-5:])  # the window holds the newest few only
    found = await recall(store, imported, "did Anna go climbing?", in_window=window)
    assert found.splitlines()[0] == f"- 2023-11-14 Anna: {TARGET}"
    assert await recall(store, imported, "did Anna go climbing?", in_window=set(ids)) == ""


async def test_a_message_with_nothing_to_look_up_recalls_nothing(store):
    here = await compacted(store, "cli:now")
    await said(store, here, ("me", "ok"), ("me", "thanks a lot"))
    assert not worth_searching("ok thanks") and not worth_searching("is it?")
    assert worth_searching("kayak?") and worth_searching("饺子") and worth_searching('"ok"')
    assert await recall(store, here, "ok thanks", in_window=set()) == ""


async def test_stewards_own_output_is_never_recalled(store):
    here = await compacted(store, "cli:now")
    old = await store.ensure_conversation("cli:old", owner="me")
    w = Writes()
    w.append(old.id, "user", "search for the climbing gym", task_id="turn1",
             created_at=1_700_000_000.0)
    w.append(old.id, "tool_result", "1. me: I went to the climbing gym", task_id="turn1",
             data={"name": "search_history"}, created_at=1_700_000_000.0)
    w.append(old.id, "assistant", 'You said: "I went to the climbing gym"', task_id="turn1",
             data={"final": True}, created_at=1_700_000_000.0)
    await store.commit(w)
    await said(store, old, ("me", TARGET))
    found = await recall(store, here, "can you tell me about the climbing gym?",
                         in_window=set())
    assert found.splitlines()[0] == f"- 2023-11-14 me: {TARGET}"
    assert "You said" not in found and "1. me:" not in found


async def test_the_conversations_own_history_comes_before_look_alikes_of_its_scope(store):
    """Twenty friends each moved flat, each told in a conversation of its own in one scope:
    asked in Vera's, Vera's move is recalled first, though the others' say it in more of
    the question's words (ranked together, they filled the room)."""
    here = await store.ensure_conversation("import:vera", owner="me")
    await said(store, here, ("Vera", "we signed for the place on Linden Street, finally"),
               *[("me", f"filler line number {i} about the weather") for i in range(3)])
    for n in range(20):
        other = await store.ensure_conversation(f"import:friend{n}", owner="me")
        await said(store, other, (f"Friend{n}", f"my new apartment is great, the new "
                                                f"apartment has a balcony, number {n}"))
    here = await store.get_conversation("import:vera")
    found = await recall(store, here, "Where is Vera's new apartment?", in_window=set())
    assert found.splitlines()[0].endswith("Vera: we signed for the place on Linden Street, "
                                          "finally")


async def test_the_request_reads_recalls_time_phrases_as_of_the_message(store, tmp_path):
    """The request for a message said on day 100 (answered late, or replayed from an
    import) recalls by that message's "last week", not today's (bot/agent/context.py)."""
    from bot.agent.context import assemble
    from bot.app.config import build_config
    from store.writes import NewEntry

    config = build_config({"llm": {"provider": "demo"}}, home=tmp_path)
    here = await compacted(store, "cli:now")
    old = await store.ensure_conversation("cli:old", owner="me")
    base = 1_700_000_000.0
    await said(store, old, ("me", "we went to the lake for the picnic"), at=base + 95 * DAY)
    await said(store, old, ("me", "we went to the mountains for the picnic"),
               at=base + 300 * DAY)
    asked = NewEntry(here.id, "user", "Where did we go for the picnic last week?",
                     created_at=base + 100 * DAY)
    made = await assemble(store, config, here.id, tools=[], model="m", pending=[asked])
    recalled = next(m.content for m in made.request.messages
                    if str(m.content).startswith("Possibly relevant"))
    first = next(line for line in recalled.splitlines() if line.startswith("- "))
    assert "lake" in first
