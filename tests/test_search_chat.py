"""Ranking in chat, where turns are a few words and a conversation is one pair of people:
a long turn that holds the question's words is not buried under short ones, and a word is
as rare as it is where the search looks (a speaker's name is in every other turn of their
conversation, however rare in the store). Both backends rank alike (store/fts_relevance.py
brings SQLite's FTS5 to what PostgreSQL's ranking does)."""

from tests.test_search import say, texts

STORY = ("so when i was a kid we lived in a tiny flat by the sea and my grandpa kept bees in "
         "the garden, which is probably why i ended up studying biology, anyway thats the "
         "long version of it")
SHORT = ["lol", "k", "same", "haha", "ya", "nah", "omg", "tbh", "fr", "yep"]


def turn(author: str, text: str) -> dict:
    return {"kind": "user", "text": text, "author": author}


async def test_a_long_turn_is_not_buried_under_short_ones(store):
    """FTS5's bm25() divides by the turn's length over the mean turn's (b = 0.75): the
    story weighed less for its two words of the question than "lol" for the name."""
    conv = await store.ensure_conversation("cli:story")
    rows = [turn("Anna" if i % 2 else "Bob", SHORT[i % len(SHORT)]) for i in range(30)]
    rows[11:11] = [turn("Anna", STORY), turn("Bob", "wait ur grandpa had bees??")]
    await say(store, conv, *rows)
    found = await texts(store, "What did Anna's grandpa do when Anna was a kid?",
                        conversation_key="cli:story", context=0)
    assert found[0] == STORY, found[:3]


async def test_a_name_is_as_common_as_it_is_in_its_conversation(store):
    """Anna is rare in the store (one conversation of many) and in every other turn of
    hers; "sister" is common in the store and said once in hers. Within her conversation
    the sister counts, not the name."""
    other = await store.ensure_conversation("cli:others")
    await say(store, other, *[turn(f"P{i}", f"my sister {SHORT[i % 10]} {i}")
                              for i in range(60)])
    conv = await store.ensure_conversation("cli:anna")
    rows = [turn("Anna" if i % 2 else "Bob", SHORT[i % len(SHORT)]) for i in range(20)]
    rows[7:7] = [turn("Bob", "what did u get ur sister for her bday?"),
                 turn("Anna", "a telescope! she loved it")]
    await say(store, conv, *rows)
    found = await texts(store, "What did Anna give her sister?", conversation_key="cli:anna",
                        context=0)
    assert found[:2] == ["what did u get ur sister for her bday?", "a telescope! she loved it"
                         ] or found[:2] == ["a telescope! she loved it",
                                            "what did u get ur sister for her bday?"], found[:4]
