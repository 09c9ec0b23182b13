"""A turn is read with its neighbours: the second ranking pass of a search.

Conversations answer in the next turn and refer back with pronouns: "what did you get your
mom?" — "a telescope!" holds the answer and no word of the question; "she loved it" says
"she" where the question says a name. The first pass (store/search.py) ranks turns alone
by their words. This pass takes its best `HEAD` candidates and lets each lend part of its
score to the turns right next to it in its conversation (before any fusion with vectors,
store/hybrid.py: reciprocal ranks are too flat to lend from):

    score'(x) = mine(x) + Σ share(n, x) × mine(n)   over x's neighbours n,
    mine(x) = score(x) × own(x)

    share   `ANSWERED` from a question (a turn ending in "?") to the turn right after it,
            the reply, and from a turn to the same person's next one, which goes on
            about it ("she loved it"); `NEIGHBOUR` otherwise, between turns next to
            each other
    own     `NAME_ONLY` for a turn whose text has none of the question's words (it was
            found by its speaker's name, or only by the question's time: "Catch ya
            later!" is no answer to "What did Anna say about the gym?"), and less
            again the fewer words it has (`FULL_TURN`: the speaker's name weighs most
            in the shortest turns, which say least); `REQUEST` for a
            message that asked Steward to search (its turn called `search_history`):
            "search my history for climbing" says nothing about climbing; else 1

A neighbour is the nearest turn on each side that is itself evidence (store/search.py
`evidence`), at most `GAP` positions away (a tool call and its result may lie between).
A turn found only as a neighbour joins the ranking as a reply or a continuation.
Everything past the first `HEAD` candidates keeps its order after them, so pages stay
disjoint and in one order.
"""

import re
from typing import NamedTuple

from store.read.plain import run

__all__ = ["rerank"]

HEAD = 60  # candidates of the first pass read with their neighbours
ANSWERED = 0.5
NEIGHBOUR = 0.25
NAME_ONLY = 0.1
REQUEST = 0.2
FULL_TURN = 12  # words: a shorter turn found without the question's words weighs less
SEARCH_RESULT = '%"name":"search_history"%'  # a tool result's data (bot/memory/search.py)
GAP = 3
_WORD = re.compile(r"\w+")
_STEM = 5  # letters compared: "climbing" and "climbed" share "climb"


COLUMNS = "id, conversation_id, seq, kind, author, task_id, text"


class Entry(NamedTuple):
    """What this pass reads of an entry (no `data`: decoding it cost more than the rest)."""

    id: int
    conversation_id: int
    seq: int
    kind: str
    author: str | None
    task_id: str | None
    text: str


_SUFFIX = re.compile(r"(?:ing|ed|es|s|ly|er|ers)$")


def _stem(word: str) -> str:
    """A rough stem, as the index's (Porter) would compare: "reading" and "read",
    "climbed" and "climbing" agree."""
    word = word.casefold()
    cut = _SUFFIX.sub("", word)
    return (cut if len(cut) >= 3 else word)[:_STEM]


def _question(e: Entry) -> bool:
    return e.text.rstrip().endswith("?")


def _continues(e: Entry, before: Entry) -> bool:
    """The same person's next turn, going on about what they just said ("she says...")."""
    return e.author is not None and e.author == before.author and e.seq - before.seq == 1


async def _around(conn, found: list[Entry]) -> list[Entry]:
    """The entries up to `GAP` positions either side of each of `found` (by the
    conversation's (conversation_id, seq) key), in one round trip."""
    pages, params = [], {}
    for n, e in enumerate(found):
        params.update({f"c{n}": e.conversation_id, f"lo{n}": e.seq - GAP,
                       f"hi{n}": e.seq + GAP})
        pages.append(f"SELECT {COLUMNS} FROM entries WHERE conversation_id = :c{n} "
                     f"AND seq BETWEEN :lo{n} AND :hi{n}")
    rows = []
    for i in range(0, len(pages), 200):  # SQLite allows 500 terms in a compound
        rows += (await run(conn, " UNION ".join(pages[i:i + 200]), params)).all()
    return [Entry(*r) for r in rows]


async def _searched(conn, entries: list[Entry]) -> set[str]:
    """The turns among those of `entries` (user messages) that called `search_history`."""
    turns = sorted({e.task_id for e in entries if e.kind == "user" and e.task_id})
    if not turns:
        return set()
    params = {f"t{n}": t for n, t in enumerate(turns)}
    rows = (await run(conn, (
        f"SELECT DISTINCT task_id FROM entries WHERE task_id IN "
        f"({', '.join(':' + k for k in params)}) AND kind = 'tool_result' "
        f"AND data LIKE :pattern"), {**params, "pattern": SEARCH_RESULT})).all()
    return {r[0] for r in rows}


async def rerank(conn, found: list[tuple[int, float]], words: list[str], *, evidence,
                 ) -> list[tuple[int, float]]:
    """`found` (entry id, score; best first: the lexical ranking, before any fusion with
    vectors) re-ranked with neighbours as evidence. `words`: the question's looked-up
    words (for `own`); `evidence(entry)`: whether an entry may be ranked at all."""
    head = found[:HEAD]
    if not head:
        return found
    score = dict(head)
    ids = {f"i{n}": i for n, (i, _) in enumerate(head)}
    rows = (await run(conn, (f"SELECT {COLUMNS} FROM entries WHERE id IN "
                             f"({', '.join(':' + k for k in ids)})"), ids)).all()
    hits = [Entry(*r) for r in rows]
    near = {e.id: e for e in await _around(conn, hits) if e.text.strip() and evidence(e)}
    by_place = {(e.conversation_id, e.seq): e for e in near.values()}
    stems = {_stem(w) for w in words if len(w) >= 3}
    requests = await _searched(conn, list(near.values()))

    def nearest(e: Entry, step: int) -> Entry | None:
        for k in range(1, GAP + 1):
            n = by_place.get((e.conversation_id, e.seq + step * k))
            if n is not None:
                return n
        return None

    def own(e: Entry) -> float:
        if e.task_id in requests:
            return REQUEST
        if not stems:
            return 1.0
        words = _WORD.findall(e.text)
        if stems & {_stem(w) for w in words}:
            return 1.0
        return NAME_ONLY * min(1.0, len(words) / FULL_TURN)

    def side(e: Entry, step: int) -> Entry | None:  # a request neither lends nor borrows
        n = nearest(e, step)
        return None if n is None or n.task_id in requests else n

    mine = {e.id: score[e.id] * own(e) for e in near.values() if e.id in score}
    new: dict[int, float] = {}
    for e in near.values():
        total = mine.get(e.id, 0.0)
        if e.task_id in requests:
            new[e.id] = total
            continue
        before, after = side(e, -1), side(e, 1)
        if before is not None and before.id in mine and stems and (
                _question(before) or _continues(e, before)):
            total += ANSWERED * mine[before.id]
        elif e.id not in mine:
            continue  # joins only as a reply or a continuation of a turn found
        elif before is not None and before.id in mine:
            total += NEIGHBOUR * mine[before.id]
        if after is not None and after.id in mine:
            total += NEIGHBOUR * mine[after.id]
        if total > 0:
            new[e.id] = total
    for i, s in head:  # a candidate whose entry is gone or not evidence keeps its place
        new.setdefault(i, s if i not in near else 0.0)
    ranked = sorted(((i, s) for i, s in new.items() if s > 0), key=lambda kv: (-kv[1], -kv[0]))
    seen = {i for i, _ in ranked}
    return ranked + [(i, s) for i, s in found[HEAD:] if i not in seen]
