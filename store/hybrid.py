"""One search over both rankings: the lexical one (store/search.py) and, when the caller
has the question's embedding, the entries nearest to it (store/vectors.py), fused.

Fusion is weighted reciprocal rank: each ranking's top `depth` candidates, and

    fused = weight / (k + lexical rank) + (1 - weight) / (k + vector rank)

(a rank beyond `depth` counts as absent). The vector ranking is the cosine similarity
times the same factors as the lexical score (speaker, recency, the question's time, its
named speaker), so both prefer the same things. Which weight and depth: bench/recall.py
measures them (the issue's caution: equal weights came out below BM25 alone on
conversational data).

The scope rules are the search's: the vector candidates come from the same conversations
(`_scope`), so a private conversation's vectors never reach another scope.
"""

import time
from dataclasses import dataclass

from store import exchanges as _exchanges
from store import search as _search
from store import vectors as _vectors
from store.read import queries as _reads
from store.records import storable

__all__ = ["Fusion", "find"]


@dataclass(frozen=True)
class Fusion:
    weight: float = 0.7  # the lexical ranking's share
    depth: int = 50  # candidates taken from each ranking
    k: float = 60.0


def _factor(near: _vectors.Near, now: float, when, names: set[str]) -> float:
    age_days = max(0.0, now - near.created_at) / 86400.0
    f = _search.SPEAKER_WEIGHT.get(near.kind, 0.5)
    f *= _search.RECENCY_FLOOR + (1 - _search.RECENCY_FLOOR) / (
        1.0 + age_days / _search.HALF_LIFE_DAYS)
    if when is not None and when[0] <= near.created_at < when[1]:
        f *= _search.TIME_BOOST
    author = (near.author or "").casefold()
    if author and any(author == n or author.startswith(n + " ") for n in names):
        f *= _search.AUTHOR_BOOST
    return f


def fuse(lexical: list[tuple[int, float]], vector: list[tuple[int, float]],
         fusion: Fusion) -> list[tuple[int, float]]:
    """(id, fused score), best first, ties by newest id."""
    fused: dict[int, float] = {}
    for weight, ranking in ((fusion.weight, lexical), (1 - fusion.weight, vector)):
        for rank, (entry_id, _) in enumerate(ranking[:fusion.depth], 1):
            fused[entry_id] = fused.get(entry_id, 0.0) + weight / (fusion.k + rank)
    return sorted(fused.items(), key=lambda kv: (-kv[1], -kv[0]))


async def find(store, query: str, *, scopes: list[str] | None = None,
               conversation_key: str | None = None, limit: int = 10, offset: int = 0,
               context: int = 1, at: float | None = None,
               when: tuple[float, float] | None = None,
               embedding: list[float] | None = None, model: str = "",
               fusion: Fusion = Fusion(), answers: bool = False) -> list:
    """A page of `Hit`s, best first: `Store.search` with the question's time (`when`) and,
    given the question's `embedding` by `model`, fused with the nearest entries; then each
    of the best read with its neighbours (store/exchanges.py). What people said is ranked,
    and with `answers` Steward's own answers too (store/search.py `evidence`)."""
    clock = at if at is not None else -(-time.time() // 3600) * 3600
    query = storable(query)
    async with store.reading() as conn:
        conversation_id = None
        if conversation_key is not None:
            conversation_id = (await _reads.conversation(conn, conversation_key)).id
        args = dict(scopes=scopes, conversation_id=conversation_id, now=clock, when=when,
                    answers=answers)
        if limit <= 0 or scopes == []:
            return []
        words = [w for t in _search.query_terms(_search.parse_query(query)) if not t.stop
                 for w in t.text.split()]

        async def lexical(depth: int):  # the words' ranking, each turn with its neighbours
            found = await _search.ranked(conn, store.dialect, query, limit=depth, offset=0,
                                         **args)
            return await _exchanges.rerank(
                conn, found, words, evidence=lambda e: _search.evidence(e, answers))

        async def page(found):
            return await _search.hits_for(conn, found[offset:offset + limit], context,
                                          answers)
        if embedding is None:
            return await page(await lexical(max(_exchanges.HEAD, offset + limit)))
        depth = max(fusion.depth, offset + limit)
        words_ranked = await lexical(max(_exchanges.HEAD, depth))
        try:
            scope = await _search._scope(conn, scopes, conversation_id)
        except _search._NoMatch:
            return []
        near = await _vectors.nearest(conn, store.dialect, model, embedding,
                                      conversation_ids=scope.ids, k=depth)
        names = {t.text.casefold() for t in _search.query_terms(_search.parse_query(query))
                 if not t.stop}
        vector = sorted(((n.id, n.similarity * _factor(n, clock, when, names)) for n in near
                         if answers or n.kind in _search.NEIGHBOUR_KINDS),
                        key=lambda kv: (-kv[1], -kv[0]))
        return await page(fuse(words_ranked, vector, Fusion(fusion.weight, depth, fusion.k)))
