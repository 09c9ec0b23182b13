"""Full-history search over the transcript: indexed, ranked, scoped, with neighbours.

The indexes are built by migration 0004 (its docstring explains the tokenizers): on SQLite
FTS5 `entries_fts` (unicode61, words) plus `entries_cjk` (trigram, for CJK text); on
PostgreSQL the generated `search_tsv` column ('simple' config, CJK characters spaced out)
with a GIN index. Every query is answered from the index; nothing loads a conversation.

Query syntax: plain words (all must match), "quoted phrases" (words in this order; for
CJK text, the exact substring). Everything the user types becomes quoted strings for the
engine, never FTS operators: `"`, `*`, `NEAR`, `OR`, `-`, `:` are just characters.
Diacritics and case are folded ("muller" finds "Müller"). Routing per term: a term with a
CJK character is a substring search (SQLite: trigram; a 1-2 character term is expanded
through the trigram vocabulary into the indexed trigrams that start with it, and only when
that list exceeds `MAX_EXPANSION`, a lone very common character, does it fall back to a
LIKE filter, which scans if no other term narrows it), any other term is a word or phrase.

Ranking, highest first, ties by newest entry id (so pages never overlap):

    score = relevance × speaker(kind) × recency(age) × phrase

    relevance  SQLite: −bm25() of each FTS table the query used, summed;
               PostgreSQL: ts_rank_cd(search_tsv, query, 1) (cover density, normalised by
               1 + log(document length)); + 1e-9 so a zero never hides recency
    speaker    user 1.0, assistant 0.8, compaction summary 0.6, tool output 0.5
    recency    0.5 + 0.5 / (1 + age_days / 180): 1 today, 0.75 at six months, never
               below 0.5, so a much better match from years ago still beats a weak new one
    phrase     1.5 when two or more query words also occur as one exact phrase, else 1

All factors are multiplicative, so the two engines' differently scaled relevance numbers
order results the same way. `now` is a parameter (the store rounds it up to the hour) so
consecutive pages are ranked against the same clock.

Cost: at most `MAX_CANDIDATES` (5000) of the newest matches in scope are ranked. A query
whose words are specific costs what its matches cost; one made only of words that occur
everywhere ("the", "ok") costs the window, not the history, at the price of ranking only
its newest 5000 matches. A scope (or one conversation) is first resolved to its
conversation ids by the scope index, with their entry counts (`last_seq`), which only
choose a plan, never change a result:

- SQLite: the FTS index yields the matches newest first, each joined by primary key to its
  entry, until the window is full. For a sparse scope (few entries next to the history's
  size: `SPARSE`) most matches lie elsewhere, so a match's id is first tested against the
  scope's entry ids (read once by `ix_entries_conversation_id`, migration 0005) and the
  index is only read between the scope's first and last entry.
- PostgreSQL: entries are filtered by `conversation_id = ANY(ids)`, so the planner sees the
  conversations' own statistics (a scope join hid that one conversation holds most of the
  history, and it sorted all of that conversation's matches). It walks the newest entries
  (primary key, or `ix_entries_conversation_id`) for common words, and takes the GIN
  index's matches for rare ones. Each search is planned for its own words
  (`plan_cache_mode = force_custom_plan` for the transaction), since a generic plan of the
  prepared statement cannot tell a rare word from a common one. Phrases are the exception:
  GIN keeps no positions and the planner prices a phrase like its words ANDed, so the
  newest `PROBE_ROWS` entries in scope are sampled first and the plan is chosen from the
  phrase's measured density (see `_postgresql_order`).

What stays proportional to the history: bm25's document frequency of a phrase (FTS5 counts
the rows that contain it), and on PostgreSQL a phrase of very common words that rarely
occur together (each entry walked is rechecked from the heap).
"""

import json
import re
from dataclasses import dataclass

from sqlalchemy import and_, literal, select, text, union_all

from store.records import Entry, entry_from_row
from store.schema import conversations, entries

__all__ = ["Hit", "Term", "explain", "parse_query", "search"]

SEARCHABLE_KINDS = ("user", "assistant", "tool_result", "compaction")
NEIGHBOUR_KINDS = ("user", "assistant", "tool_result")
SPEAKER_WEIGHT = {"user": 1.0, "assistant": 0.8, "compaction": 0.6, "tool_result": 0.5}
HALF_LIFE_DAYS = 180.0
RECENCY_FLOOR = 0.5
PHRASE_BOOST = 1.5
MAX_QUERY_CHARS = 1000
MAX_TERMS = 12
MAX_CANDIDATES = 5000  # matches ranked at most: the newest ones in scope
MAX_EXPANSION = 1000  # trigrams a short CJK term may expand to before it falls back to LIKE
# SQLite: a scope of S entries in a history of T is "sparse" when S * S < SPARSE * N * T
# (N: candidates). Walking the index and joining each match to its entry costs ~1.3 us; a
# scope is cheaper to filter by its entry ids (~0.15 us each to collect, ~0.07 us per match
# to test) once S * 0.15 < (N * T / S) * 1.3, the matches walked to find N in scope.
SPARSE = 8
PROBE_ROWS = 2000  # PostgreSQL phrase queries: newest entries in scope sampled first
# Must match migration 0004 (the trigger's GLOB and steward_search_fold).
CJK_RANGES = ("\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
              "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f")
_UNION_MAX = 200
_CJK = re.compile(f"[{CJK_RANGES}]")
_TOKENS = re.compile(r'"([^"]*)"?|([^\s"]+)')


@dataclass(frozen=True)
class Term:
    """One part of a query: a word or a quoted phrase (text without the quotes)."""

    text: str
    phrase: bool = False

    @property
    def cjk(self) -> bool:
        return _CJK.search(self.text) is not None


@dataclass(frozen=True)
class Hit:
    """One search result: the entry, where it was said, how well it matched, and the
    entries around it in the same conversation (oldest first)."""

    entry: Entry
    conversation_key: str
    score: float
    before: tuple[Entry, ...] = ()
    after: tuple[Entry, ...] = ()


def _trim(s: str) -> str:
    """Without leading and trailing punctuation and spaces (tokenizers drop them anyway)."""
    start, end = 0, len(s)
    while start < end and not s[start].isalnum():
        start += 1
    while end > start and not s[end - 1].isalnum():
        end -= 1
    return s[start:end]


def parse_query(query: str) -> list[Term]:
    """The terms of a user's query; those without a letter or digit are dropped."""
    terms: list[Term] = []
    seen: set[str] = set()
    for m in _TOKENS.finditer(query[:MAX_QUERY_CHARS]):
        phrase = m.group(1) is not None
        body = _trim(" ".join((m.group(1) if phrase else m.group(2)).split()))
        if not body or body.casefold() in seen:
            continue
        seen.add(body.casefold())
        terms.append(Term(body, phrase and " " in body))
        if len(terms) == MAX_TERMS:
            break
    return terms


def _fts_string(s: str) -> str:
    """An FTS5 string literal: the tokenizer sees `s`, the query parser sees no syntax."""
    return '"' + s.replace('"', '""') + '"'


def _like_pattern(s: str) -> str:
    return "%" + s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _score_sql(relevance: str, phrase: str | None) -> str:
    speaker = " ".join(f"WHEN '{k}' THEN {w}" for k, w in SPEAKER_WEIGHT.items())
    age_days = "(CASE WHEN :now > w.created_at THEN :now - w.created_at ELSE 0 END) / 86400.0"
    recency = (f"({RECENCY_FLOOR} + {1 - RECENCY_FLOOR} / "
               f"(1.0 + {age_days} / {HALF_LIFE_DAYS}))")
    boost = f" * (CASE WHEN {phrase} THEN {PHRASE_BOOST} ELSE 1.0 END)" if phrase else ""
    return (f"(({relevance}) + 1e-9) * (CASE w.kind {speaker} ELSE 0.5 END) * {recency}"
            f"{boost}")


class _NoMatch(Exception):
    """A term that cannot match anything: the whole (AND) query has no results."""


@dataclass(frozen=True)
class _Scope:
    """Where a search may look: the conversations (None: all of them), and how many
    entries they hold out of how many in the store (estimates that only choose a plan)."""

    ids: list[int] | None
    rows: int
    total: int


async def _scope(conn, scopes: list[str] | None, conversation_id: int | None) -> _Scope:
    """The scope resolved to conversation ids, read by the scope index: the engines then
    filter entries by `conversation_id` (PostgreSQL plans with that column's statistics,
    which know one conversation from another; a join on `scope` hides its skew)."""
    total = (await conn.execute(text("SELECT max(id) FROM entries"))).scalar() or 0
    if scopes is None and conversation_id is None:
        return _Scope(None, total, total)
    where, params = [], {}
    if conversation_id is not None:
        where.append("id = :cid")
        params["cid"] = conversation_id
    if scopes is not None:
        params.update({f"s{i}": scope for i, scope in enumerate(scopes)})
        where.append(f"scope IN ({', '.join(f':s{i}' for i in range(len(scopes)))})")
    rows = (await conn.execute(text(
        f"SELECT id, last_seq FROM conversations WHERE {' AND '.join(where)}"), params)).all()
    if not rows:
        raise _NoMatch("no conversation in scope")
    # last_seq counts a conversation's entries: a wrong one costs time, never results.
    return _Scope([r.id for r in rows], sum(max(r.last_seq, 0) for r in rows), total)


def _filters(params: dict, scope: _Scope, dialect: str) -> list[str]:
    """WHERE conditions for kind and scope on `entries e`."""
    kinds = ", ".join(f"'{k}'" for k in SEARCHABLE_KINDS)
    where = [f"e.kind IN ({kinds})"]
    if scope.ids is not None and dialect == "postgresql":
        params["cids"] = scope.ids
        where.append("e.conversation_id = ANY(CAST(:cids AS bigint[]))")
    elif scope.ids is not None:  # one JSON parameter, however many conversations
        params["cids"] = json.dumps(scope.ids)
        where.append("e.conversation_id IN (SELECT value FROM json_each(:cids))")
    return where


async def _expand_short_cjk(conn, term: str) -> list[str] | None:
    """The indexed trigrams that start with a 1-2 character term (every occurrence of the
    term starts one: the indexed text ends in two spaces); None if there are too many."""
    low = term.lower()
    rows = (await conn.execute(text(
        "SELECT term FROM entries_cjk_vocab WHERE term >= :lo AND term < :hi LIMIT :n"),
        {"lo": low, "hi": low + "\U0010ffff", "n": MAX_EXPANSION + 1})).all()
    if not rows:
        raise _NoMatch(term)
    return None if len(rows) > MAX_EXPANSION else [r[0] for r in rows]


async def _sqlite_ranking(conn, terms: list[Term], scope: _Scope, now, window: int):
    params: dict = {"now": now}
    words = [t for t in terms if not t.cjk]
    cjk_parts, likes = [], []
    for t in (t for t in terms if t.cjk):
        if len(t.text) >= 3:
            cjk_parts.append(_fts_string(t.text))
            continue
        trigrams = await _expand_short_cjk(conn, t.text)
        if trigrams is None:
            likes.append(t.text)
        else:
            cjk_parts.append("(" + " OR ".join(_fts_string(g) for g in trigrams) + ")")
    sources = []
    if words:
        sources.append(("entries_fts", " AND ".join(_fts_string(t.text) for t in words)))
    if cjk_parts:
        sources.append(("entries_cjk", " AND ".join(cjk_parts)))
    where = _filters(params, scope, "sqlite")
    joins, relevance = [], []
    for i, (table, match) in enumerate(sources):
        params[f"m{i}"] = match
        joins.append(f"(SELECT rowid AS id, -bm25({table}) AS rel FROM {table} "
                     f"WHERE {table} MATCH :m{i}) AS m{i}")
        where.append(f"m{i}.id = e.id")
        relevance.append(f"m{i}.rel")
    if sources and scope.ids is not None and scope.rows ** 2 < SPARSE * window * scope.total:
        # A sparse scope: most matches lie outside it, and joining each to its entry to
        # find out would cost the whole history for a common word. Test the match's id
        # against the scope's entry ids instead (collected once by ix_entries_conversation_id;
        # `+` keeps FTS5 from turning the list into one index lookup per id), and walk
        # only the index's stretch between the scope's first and last entry: an old scope
        # then never reads the newer history at all.
        ids = "SELECT id FROM entries WHERE conversation_id IN (SELECT value FROM json_each(:cids))"
        lo, hi = (await conn.execute(text(f"SELECT min(id), max(id) FROM ({ids})"),
                                     {"cids": params["cids"]})).one()
        if lo is None:
            raise _NoMatch("an empty scope")
        params.update(lo=lo, hi=hi)
        where += [f"+m0.id IN ({ids})", "m0.id BETWEEN :lo AND :hi"]
    for i, s in enumerate(likes):
        params[f"l{i}"] = _like_pattern(s)
        where.append(f"e.text LIKE :l{i} ESCAPE '\\'")
    # The index drives, newest match first (CROSS JOIN fixes the order; FTS5 yields rowids
    # in descending order itself): entries are read by primary key, for matching rows only,
    # until the window is full; bm25() is computed for those rows only.
    joins.append("entries AS e")
    window_sql = (f"SELECT e.id AS id, e.kind AS kind, e.created_at AS created_at, "
                  f"{' + '.join(relevance) or '1.0'} AS rel FROM {' CROSS JOIN '.join(joins)} "
                  f"WHERE {' AND '.join(where)} "
                  f"ORDER BY {'m0' if sources else 'e'}.id DESC LIMIT :window")
    phrase = None
    if len(words) >= 2:
        params["phrase"] = _fts_string(" ".join(t.text for t in words))
        phrase = "w.id IN (SELECT rowid FROM entries_fts WHERE entries_fts MATCH :phrase)"
    return (f"SELECT w.id AS id, {_score_sql('w.rel', phrase)} AS score "
            f"FROM ({window_sql}) AS w"), params


async def _postgresql_order(conn, params: dict, where: list[str], scope: _Scope,
                            window: int) -> str:
    """How to collect a phrase query's newest matches: walk the entries newest first
    ("e.id DESC", stopping at the window) or take every match the GIN index yields and
    sort them ("e.id + 0 DESC": no index has that order, so the planner cannot walk).

    The planner cannot tell: GIN keeps no positions, so it estimates a phrase like its
    words ANDed, and "and have" or "the can lolintulmar" look common when the phrase is
    rare; its walk then reads the whole history (seconds at 10^6 entries). So measure:
    the newest PROBE_ROWS entries in scope show how dense the phrase is (rows a walk
    reads per match) and how dense its words are (rows the index makes us recheck)."""
    probe = (f"SELECT count(*) FILTER (WHERE r.tsv @@ CAST(:q AS tsquery)), "
             f"count(*) FILTER (WHERE r.tsv @@ CAST(:qa AS tsquery)), count(*) "
             f"FROM (SELECT e.search_tsv AS tsv FROM entries AS e WHERE {' AND '.join(where)}"
             f" ORDER BY e.id DESC LIMIT :k) AS r")
    hits, candidates, seen = (await conn.execute(
        text(probe), {**params, "k": PROBE_ROWS})).one()
    if seen < PROBE_ROWS:
        return "e.id DESC"  # the whole scope is this small: any plan is cheap
    walk = window * seen / max(hits, 1)  # rows read to find the window's matches
    recheck = candidates * scope.rows / seen  # matches of the words, all rechecked
    return "e.id + 0 DESC" if recheck < walk else "e.id DESC"


async def _postgresql_ranking(conn, terms: list[Term], scope: _Scope, now, window: int):
    params: dict = {"now": now}
    parts = []
    for i, t in enumerate(terms):
        params[f"t{i}"] = t.text
        parts.append(f"phraseto_tsquery('simple', steward_search_fold(:t{i}))")
    words = [t for t in terms if not t.cjk]
    phrase_sql = "NULL"
    if len(words) >= 2:
        params["all"] = " ".join(t.text for t in words)
        phrase_sql = "phraseto_tsquery('simple', steward_search_fold(:all))"
    # The query's words ANDed, without positions: what the GIN index can answer alone.
    params["every"] = " ".join(t.text for t in terms)
    row = (await conn.execute(text(
        f"SELECT CAST({' && '.join(parts)} AS text), CAST({phrase_sql} AS text), "
        f"CAST(plainto_tsquery('simple', steward_search_fold(:every)) AS text)"),
        params)).one()
    if not row[0]:
        raise _NoMatch("no words")
    params = {"now": now, "q": row[0]}
    where = _filters(params, scope, "postgresql")
    order = "e.id DESC"
    if row[0] != row[2]:  # a phrase (or CJK, which is searched as a phrase of characters)
        order = await _postgresql_order(conn, {**params, "qa": row[2]}, where, scope, window)
    where.insert(0, "e.search_tsv @@ CAST(:q AS tsquery)")
    window_sql = (f"SELECT e.id AS id, e.kind AS kind, e.created_at AS created_at, "
                  f"e.search_tsv AS tsv FROM entries AS e WHERE {' AND '.join(where)} "
                  f"ORDER BY {order} LIMIT :window")
    phrase = None
    if row[1]:
        params["p"] = row[1]
        phrase = "w.tsv @@ CAST(:p AS tsquery)"
    relevance = "CAST(ts_rank_cd(w.tsv, CAST(:q AS tsquery), 1) AS double precision)"
    return (f"SELECT w.id AS id, {_score_sql(relevance, phrase)} AS score "
            f"FROM ({window_sql}) AS w"), params


async def _ranking(conn, dialect: str, terms, scopes, conversation_id, now, window: int):
    if dialect == "postgresql":
        # asyncpg prepares statements, and after five runs PostgreSQL may switch to a
        # generic plan that cannot see how selective this query's words are (and scans):
        # plan each search for its own words, for the rest of this transaction.
        await conn.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))
    scope = await _scope(conn, scopes, conversation_id)
    if dialect != "postgresql":
        return await _sqlite_ranking(conn, terms, scope, now, window)
    return await _postgresql_ranking(conn, terms, scope, now, window)


async def _neighbours(conn, found: list[Entry], context: int) -> dict:
    """{(entry id, "before"|"after"): [entries]}: up to `context` readable entries each side
    of every hit, by cursor on (conversation, seq), all in one round trip."""
    if context <= 0 or not found:
        return {}
    pages = []
    for e in found:
        near = and_(entries.c.conversation_id == e.conversation_id,
                    entries.c.kind.in_(NEIGHBOUR_KINDS), entries.c.text != "")
        for side, cond, order in (("before", entries.c.seq < e.seq, entries.c.seq.desc()),
                                  ("after", entries.c.seq > e.seq, entries.c.seq)):
            page = (select(entries, literal(e.id).label("hit"), literal(side).label("side"))
                    .where(near, cond).order_by(order).limit(context).subquery())
            pages.append(select(page))
    out: dict = {}
    for i in range(0, len(pages), _UNION_MAX):  # SQLite allows 500 terms in a compound
        for row in (await conn.execute(union_all(*pages[i:i + _UNION_MAX]))).all():
            out.setdefault((row.hit, row.side), []).append(entry_from_row(row))
    return {key: sorted(page, key=lambda n: n.seq) for key, page in out.items()}


async def search(conn, dialect: str, query: str, *, scopes: list[str] | None,
                 conversation_id: int | None, limit: int, offset: int, now: float,
                 context: int = 1, candidates: int = MAX_CANDIDATES) -> list[Hit]:
    """One page of ranked hits for `query`, best first.

    `scopes`: only conversations whose scope is listed (None: no restriction; an empty
    list: nothing). `conversation_id`: only that conversation (not its fork ancestors).
    `now`: the clock for recency. `context`: neighbours read each side of a hit.
    `candidates`: how many of the newest matches are ranked at most."""
    terms = parse_query(query)
    if not terms or limit <= 0 or scopes == []:
        return []
    try:
        sql, params = await _ranking(conn, dialect, terms, scopes, conversation_id, now,
                                     candidates)
    except _NoMatch:
        return []
    params.update(limit=limit, offset=max(0, offset), window=candidates)
    ranked = (await conn.execute(text(
        f"{sql} ORDER BY score DESC, id DESC LIMIT :limit OFFSET :offset"), params)).all()
    if not ranked:
        return []
    rows = (await conn.execute(
        select(entries, conversations.c.key.label("conversation_key"))
        .join(conversations, conversations.c.id == entries.c.conversation_id)
        .where(entries.c.id.in_([r.id for r in ranked])))).all()
    by_id = {r.id: (entry_from_row(r), r.conversation_key) for r in rows}
    near = await _neighbours(conn, [by_id[r.id][0] for r in ranked], context)
    return [Hit(by_id[r.id][0], by_id[r.id][1], float(r.score),
                tuple(near.get((r.id, "before"), ())), tuple(near.get((r.id, "after"), ())))
            for r in ranked]


async def explain(conn, dialect: str, query: str, *, scopes: list[str] | None = None,
                  conversation_id: int | None = None, now: float = 0.0) -> str:
    """The database's plan for the ranking query (diagnostics, and the tests that check
    it is answered from the full-text index)."""
    terms = parse_query(query)
    try:
        if not terms:
            raise _NoMatch(query)
        sql, params = await _ranking(conn, dialect, terms, scopes, conversation_id, now,
                                     MAX_CANDIDATES)
    except _NoMatch:
        return ""
    params.update(limit=10, offset=0, window=MAX_CANDIDATES)
    prefix = "EXPLAIN" if dialect == "postgresql" else "EXPLAIN QUERY PLAN"
    rows = (await conn.execute(text(
        f"{prefix} {sql} ORDER BY score DESC, id DESC LIMIT :limit OFFSET :offset"),
        params)).all()
    return "\n".join(" ".join(str(v) for v in r) for r in rows)
