"""Full-history search over the transcript: ranked retrieval for natural language, indexed,
scoped, with neighbours.

The index (migration 0008 rebuilt 0004's in place; its docstring has the details) holds
each searchable entry's speaker name followed by its text, stemmed for English:

- SQLite: FTS5 `entries_fts` (contentless, tokenizer `porter unicode61 remove_diacritics
  2`) plus `entries_cjk` (trigram, for CJK text, unchanged since 0004).
- PostgreSQL: the `search_vec` column (`simple` config for the name, `english` for the
  text, CJK characters spaced out by `steward_search_fold`) with the GIN index
  `ix_entries_search`.

Every query is answered from the index; nothing loads a conversation.

Query syntax. A query is words or a question in plain language: every word counts towards
the score, none is required ("When did Anna go to the climbing gym?" finds Anna saying she
went to the climbing gym). Words are stemmed ("climbing" finds "climbed"), case and
diacritics folded ("muller" finds "Müller"); English stop words ("when", "did", "the"…, and
a few words questions are made of: "say", "tell", "remember"…: `STOP_WORDS`) are left out
unless the query has nothing else. A speaker's name is searchable like a word of what they said.
`"quoted text"` must occur as it is written (words in this order; CJK: the exact
substring); a trailing `word*` (three or more letters) finds words starting with it. Every
other character is just a character: the user's text reaches the engines as quoted strings
or lexemes, never as FTS or tsquery syntax (`NEAR`, `OR`, `-`, `:`, `&` are no operators).
A term with a CJK character is a substring search (SQLite: trigram; a 1-2 character term is
expanded through the trigram vocabulary into the indexed trigrams that start with it, and
only when that list exceeds `MAX_EXPANSION`, a lone very common character, falls back to a
LIKE filter that walks the newest entries).

Ranking, highest first, ties by newest entry id (so pages never overlap):

    score = relevance × speaker(kind) × recency(age) × phrase

    relevance  Okapi BM25 summed over the query's terms: each term's weight (its inverse
               document frequency: rare words count, common ones barely) times how often
               it occurs in the entry, saturating, normalised by the entry's length.
               SQLite: −bm25() of the term's own FTS5 query, re-weighed for chat
               (store/fts_relevance.py: length normalisation b 0.25, not FTS5's fixed
               0.75; within a scope the document frequency counted there, as on
               PostgreSQL, not over the whole index); PostgreSQL: ln(1 + (N − df + ½)/(df + ½))
               × ts_rank(weights 1, normalisation 1), df counted in scope (at least what
               ANALYZE's lexeme statistics say for a common word); + 1e-9 so a zero
               never hides recency
    speaker    user 1.0, assistant 0.8, compaction summary 0.6, tool output 0.5
    recency    0.5 + 0.5 / (1 + age_days / 180): 1 today, 0.75 at six months, never
               below 0.5, so a much better match from years ago still beats a weak new one
    phrase     1.5 when two words next to each other in the query also occur next to
               each other in the entry, else 1

`now` is a parameter (the store rounds it up to the hour) so consecutive pages are ranked
against the same clock.

Cost: each term is looked up on its own, and at most `MAX_CANDIDATES` (5000, shared by the
terms but at least `MIN_TERM_WINDOW` each) of its newest matches in scope are ranked. A
rare word brings all its matches; a word that occurs everywhere ("ok", a speaker's name)
costs its window, not the history, at the price of being counted only for its newest
matches. The candidates of all terms are then summed up per entry. A scope (or one
conversation) is first resolved to its conversation ids by the scope index, with their
entry counts (`last_seq`), which only choose a plan, never change a result:

- SQLite: the FTS index yields a term's matches newest first, each joined by primary key
  to its entry, until the window is full. For a sparse scope (few entries next to the
  history's size: `SPARSE`) most matches lie elsewhere, so a match's id is first tested
  against the scope's entry ids (read once by `ix_entries_conversation_id`, migration 0005)
  and the index is only read between the scope's first and last entry.
- PostgreSQL: entries are filtered by `conversation_id = ANY(ids)`, so the planner sees the
  conversations' own statistics (a scope join hid that one conversation holds most of the
  history, and it sorted all of that conversation's matches). It walks the newest entries
  (primary key, or `ix_entries_conversation_id`) for common words, and takes the GIN
  index's matches for rare ones. Each search is planned for its own words
  (`plan_cache_mode = force_custom_plan` for the transaction), since a generic plan of the
  prepared statement cannot tell a rare word from a common one. Phrases are the exception:
  GIN keeps no positions and the planner prices a phrase like its words ANDed, so the
  newest `PROBE_ROWS` entries in scope are sampled first and the plan is chosen from the
  phrase's measured density (see `_postgresql_orders`, which does the same for every
  term: the planner also walks far too readily for a word that is not spread evenly).

What stays proportional to the history: bm25's document frequency of a term (FTS5 counts
the rows that contain it), on SQLite the phrase boost's list of every entry that holds one
of the query's word pairs (a list of ids, built once per search), and on PostgreSQL a
phrase of very common words that rarely occur together (each entry walked is rechecked
from the heap).
"""

import json
import re
import time
import weakref
from dataclasses import dataclass

from store import fts_relevance
from store.read.plain import run
from store.read.queries import ENTRY as ENTRY_COLUMNS
from store.records import Entry, entry_from_row

__all__ = ["STOP_WORDS", "Hit", "Term", "explain", "hits_for", "parse_query", "query_terms",
           "ranked", "search"]

SEARCHABLE_KINDS = ("user", "assistant", "tool_result", "compaction")  # what the index holds
NEIGHBOUR_KINDS = ("user", "assistant")
SCHEDULER = "scheduler"  # the author of a reminder's message (bot/scheduler/loop.py)
# What people said is evidence; Steward's own output is not, unless asked for (`answers`):
# its answers (an assistant entry a turn wrote, so with a task id: the demo model's echo, an
# answer quoting search hits, an approval request) and summaries. Tool results (search hits,
# pages fetched) and the scheduler's reminder messages never are. Imported assistant
# entries (a person's own sent mail, a Slack bot's posts) have no task: what was said.
EVIDENCE_SQL = ("(e.kind = 'user' AND (e.author IS NULL OR e.author != 'scheduler') OR "
                "e.kind = 'assistant' AND e.task_id IS NULL)")
ANSWERS_SQL = ("(e.kind IN ('user', 'assistant', 'compaction') AND "
               "(e.author IS NULL OR e.author != 'scheduler'))")
SPEAKER_WEIGHT = {"user": 1.0, "assistant": 0.8, "compaction": 0.6, "tool_result": 0.5}
HALF_LIFE_DAYS = 180.0
RECENCY_FLOOR = 0.5
PHRASE_BOOST = 1.5
TIME_BOOST = 3.0  # an entry said within the question's time ("last spring")
AUTHOR_BOOST = 1.5  # an entry whose speaker the question names ("what did Anna say…")
TIME_ROWS = 1000  # entries said within the question's time ranked even without a word
MAX_QUERY_CHARS = 1000
MAX_TERMS = 12  # terms looked up (the longest, if a query has more)
MIN_PREFIX = 3  # letters before a `*` for a prefix search
LOOSE_PREFIX = 5  # letters of a long word of a quote that matched nothing, as a prefix
MAX_CANDIDATES = 5000  # matches ranked at most: the newest ones in scope
MIN_TERM_WINDOW = 1000  # ... of which each term gets at least this many
MAX_EXPANSION = 1000  # trigrams a short CJK term may expand to before it falls back to LIKE
# SQLite: a scope of S entries in a history of T is "sparse" when S * S < SPARSE * W * T
# (W: a term's window, `_per_term`). Walking the index and joining each match to its entry
# costs ~1.3 us; a scope is cheaper to filter by its entry ids (~0.15 us each to collect,
# ~0.07 us per match to test) once S * 0.15 < (W * T / S) * 1.3, the matches walked to find
# W in scope. Each term's branch collects the ids for itself (they are held until the
# statement ends), so the test is per term: with the whole window instead, a scope that is
# the whole history took this plan until 40,000 entries, slower, holding the scope's ids
# once per term (bench/soak.py: the recall's search peaked at 4 MB above SQLite's base).
SPARSE = 8
PROBE_ROWS = 2000  # PostgreSQL phrase queries: newest entries in scope sampled first
SHARES_SECONDS = 600.0  # PostgreSQL: lexeme statistics are read again after this long
# Must match migration 0004 (the trigger's GLOB and steward_search_fold).
CJK_RANGES = ("\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
              "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f")
# English words that carry no topic: pronouns, articles, auxiliaries, prepositions,
# conjunctions, question words (PostgreSQL's `english` configuration drops all of these
# from its index too), and the verbs a question about what was said is made of. Not "may"
# (the month) nor verbs such as "go" or "get": in "where is Dev going in May?" both count.
STOP_WORDS = frozenset("""
    i me my mine myself we us our ours ourselves you your yours yourself yourselves
    he him his himself she her hers herself it its itself they them their theirs themselves
    a an the this that these those some any each every all both either neither
    no nor not only own same such other another few more most much many
    am is are was were be been being have has had having do does did doing done
    can could will would shall should might must
    of at by for with about against between into through during before after above below
    to from up down in out on off over under again further then once
    and but if or because as until while than so too very just also
    what which who whom whose when where why how here there now s t don
    say says said tell tells told mention mentioned talk talked remember please thanks thank
""".split())
_UNION_MAX = 200
_CJK = re.compile(f"[{CJK_RANGES}]")
_TOKENS = re.compile(r'"([^"]*)"?|([^\s"]+)')
_LEXEME = re.compile(r"'((?:[^']|'')*)'")
_POSSESSIVE = re.compile(r"(?<=\w)['\u2019][sS]$")


@dataclass(frozen=True)
class Term:
    """One part of a query: a word, a quoted text (`quoted`: it must occur; `phrase`: of
    several words, in this order) or a prefix (`word*`). `text` is without quotes or `*`."""

    text: str
    phrase: bool = False
    quoted: bool = False
    prefix: bool = False

    @property
    def cjk(self) -> bool:
        return _CJK.search(self.text) is not None

    @property
    def stop(self) -> bool:
        return not (self.quoted or self.prefix) and self.text.casefold() in STOP_WORDS


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
    """The terms of a user's query in order, each once, stop words included (see
    `query_terms`); those without a letter or digit are dropped."""
    terms: list[Term] = []
    seen: set[tuple[str, bool]] = set()
    for m in _TOKENS.finditer(query[:MAX_QUERY_CHARS]):
        quoted = m.group(1) is not None
        raw = " ".join((m.group(1) if quoted else m.group(2)).split())
        body = _trim(raw) if quoted else _POSSESSIVE.sub("", _trim(raw))  # "Anna's": Anna
        prefix = (not quoted and raw.endswith("*") and len(body) >= MIN_PREFIX
                  and body.isalnum() and not _CJK.search(body))
        if not body or (body.casefold(), prefix) in seen:
            continue
        seen.add((body.casefold(), prefix))
        terms.append(Term(body, phrase=quoted and " " in body, quoted=quoted, prefix=prefix))
    return terms


def query_terms(terms: list[Term]) -> list[Term]:
    """The terms a search looks up: without stop words (unless there is nothing else), at
    most `MAX_TERMS` (quoted ones first, then the longest), in the query's order."""
    content = [t for t in terms if not t.stop] or terms
    if len(content) > MAX_TERMS:
        ranked = sorted(range(len(content)),
                        key=lambda i: (not content[i].quoted, -len(content[i].text), i))
        keep = set(ranked[:MAX_TERMS])
        content = [t for i, t in enumerate(content) if i in keep]
    return content


def _pairs(terms: list[Term]) -> list[str]:
    """Neighbouring plain words of the query ("climbing gym"): an entry that has one of
    them as a phrase gets the phrase boost."""
    def plain(t: Term) -> bool:
        return not (t.stop or t.quoted or t.prefix or t.cjk)
    return [f"{a.text} {b.text}" for a, b in zip(terms, terms[1:], strict=False)
            if plain(a) and plain(b)][:MAX_TERMS]


def _per_term(window: int, n: int) -> int:
    """Newest matches ranked per term: the window, shared when there are several terms."""
    return window if n <= 1 else max(window // n, min(window, MIN_TERM_WINDOW))


def _fts_string(s: str) -> str:
    """An FTS5 string literal: the tokenizer sees `s`, the query parser sees no syntax."""
    return '"' + s.replace('"', '""') + '"'


def _truncations(word: str) -> list[str]:
    """A prefix's shorter forms (down to 4 letters): the stem of a longer word may be
    shorter than what the user typed ("organi*" finds "organize", indexed as "organ")."""
    return [word[:-k] for k in (1, 2, 3) if len(word) - k >= 4]


def _fts_match(t: Term) -> str:
    if t.prefix:
        return " OR ".join([_fts_string(t.text) + " *",
                            *(_fts_string(w) for w in _truncations(t.text))])
    return _fts_string(t.text)


def _like_pattern(s: str) -> str:
    return "%" + s.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _author_sql(params: dict, terms: list[Term]) -> str | None:
    """Whether `w.author` is a person the query names: a plain word of the query is the
    speaker's name or its first part ("Anna" for "Anna Berg"), case folded."""
    names = sorted({t.text.casefold() for t in terms
                    if not (t.quoted or t.prefix or t.cjk or t.stop) and len(t.text) >= 2})
    if not names:
        return None
    conds = []
    for k, name in enumerate(names[:MAX_TERMS]):
        params[f"au{k}"], params[f"ap{k}"] = name, name + " %"
        conds.append(f"lower(w.author) = :au{k} OR lower(w.author) LIKE :ap{k}")
    return " OR ".join(conds)


def _score_sql(relevance: str, phrase: str | None, author: str | None = None,
               window: bool = False) -> str:
    speaker = " ".join(f"WHEN '{k}' THEN {w}" for k, w in SPEAKER_WEIGHT.items())
    age_days = "(CASE WHEN :now > w.created_at THEN :now - w.created_at ELSE 0 END) / 86400.0"
    recency = (f"({RECENCY_FLOOR} + {1 - RECENCY_FLOOR} / "
               f"(1.0 + {age_days} / {HALF_LIFE_DAYS}))")
    boost = f" * (CASE WHEN {phrase} THEN {PHRASE_BOOST} ELSE 1.0 END)" if phrase else ""
    if author:
        boost += f" * (CASE WHEN {author} THEN {AUTHOR_BOOST} ELSE 1.0 END)"
    if window:
        boost += (f" * (CASE WHEN w.created_at >= :since AND w.created_at < :until "
                  f"THEN {TIME_BOOST} ELSE 1.0 END)")
    return (f"(({relevance}) + 1e-9) * (CASE w.kind {speaker} ELSE 0.5 END) * {recency}"
            f"{boost}")


def _summed(branches: list[str], required: int, boost: str) -> str:
    """The terms' candidates, one row per entry: relevance summed over the terms that
    found it, and only entries that every required (quoted) term found."""
    having = f" HAVING sum(u.req) = {required}" if required else ""
    union = " UNION ALL ".join(f"SELECT * FROM ({b}) AS b{i}" for i, b in enumerate(branches))
    return (f"SELECT u.id AS id, max(u.kind) AS kind, max(u.created_at) AS created_at, "
            f"max(u.author) AS author, sum(u.rel) AS rel{boost} FROM ({union}) AS u "
            f"GROUP BY u.id{having}")


def _window_branch(where: list[str], extra: str = "") -> str:
    """The newest `TIME_ROWS` entries in scope said within the question's time, each found
    with no relevance: a question of time and people ("what did Anna say yesterday?")
    ranks what was said then even where no word matches."""
    cond = " AND ".join([*where, "e.created_at >= :since", "e.created_at < :until"])
    return (f"SELECT e.id AS id, e.kind AS kind, e.created_at AS created_at, "
            f"e.author AS author, 0.0 AS rel{extra}, 0 AS req FROM entries AS e "
            f"WHERE {cond} ORDER BY e.created_at DESC LIMIT :tw")


class _NoMatch(Exception):
    """Nothing can match: a required term that matches nothing, or an empty scope."""


@dataclass(frozen=True)
class _Ranked:
    id: int
    score: float


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
    total = (await run(conn, ("SELECT max(id) FROM entries"))).scalar() or 0
    if scopes is None and conversation_id is None:
        return _Scope(None, total, total)
    where, params = [], {}
    if conversation_id is not None:
        where.append("id = :cid")
        params["cid"] = conversation_id
    if scopes is not None:
        params.update({f"s{i}": scope for i, scope in enumerate(scopes)})
        where.append(f"scope IN ({', '.join(f':s{i}' for i in range(len(scopes)))})")
    rows = (await run(conn, (
        f"SELECT id, last_seq FROM conversations WHERE {' AND '.join(where)}"), params)).all()
    if not rows:
        raise _NoMatch("no conversation in scope")
    # last_seq counts a conversation's entries: a wrong one costs time, never results.
    return _Scope([r.id for r in rows], sum(max(r.last_seq, 0) for r in rows), total)


def evidence(e: Entry, answers: bool = False) -> bool:
    """Whether an entry is ranked (`EVIDENCE_SQL`, `ANSWERS_SQL` in Python)."""
    if e.kind == "user":
        return e.author != SCHEDULER
    if e.kind == "assistant":
        return answers or e.task_id is None
    return answers and e.kind == "compaction"


def _filters(params: dict, scope: _Scope, dialect: str, answers: bool = False) -> list[str]:
    """WHERE conditions for kind and scope on `entries e`."""
    kinds = ", ".join(f"'{k}'" for k in ("user", "assistant", "compaction")[:3 if answers else 2])
    where = [f"e.kind IN ({kinds})", ANSWERS_SQL if answers else EVIDENCE_SQL]
    if scope.ids is not None and dialect == "postgresql":
        params["cids"] = scope.ids
        where.append("e.conversation_id = ANY(CAST(:cids AS bigint[]))")
    elif scope.ids is not None:  # one JSON parameter, however many conversations
        params["cids"] = json.dumps(scope.ids)
        where.append("e.conversation_id IN (SELECT value FROM json_each(:cids))")
    return where


async def _expand_short_cjk(conn, term: str) -> list[str] | None:
    """The indexed trigrams that start with a 1-2 character term (every occurrence of the
    term starts one: the indexed text ends in two spaces): [] if none, None if too many."""
    low = term.lower()
    rows = (await run(conn, (
        "SELECT term FROM entries_cjk_vocab WHERE term >= :lo AND term < :hi LIMIT :n"),
        {"lo": low, "hi": low + "\U0010ffff", "n": MAX_EXPANSION + 1})).all()
    return None if len(rows) > MAX_EXPANSION else [r[0] for r in rows]


async def _sqlite_source(conn, t: Term) -> tuple[str, str] | None:
    """Where a term is looked up: (FTS table, MATCH string), ("", LIKE pattern) for a very
    common short CJK term, or None if it cannot match."""
    if not t.cjk:
        return "entries_fts", _fts_match(t)
    if len(t.text) >= 3:
        return "entries_cjk", _fts_string(t.text)
    trigrams = await _expand_short_cjk(conn, t.text)
    if trigrams is None:
        return "", _like_pattern(t.text)
    return ("entries_cjk", " OR ".join(_fts_string(g) for g in trigrams)) if trigrams else None


async def _index_df(conn, sources: list[tuple[str, str] | None]) -> dict[int, int]:
    """{term's index: its document frequency in `entries_fts`}, in one round trip (what
    bm25() counts too: a walk of the term's list of rows)."""
    words = {i: s[1] for i, s in enumerate(sources) if s is not None and s[0] == "entries_fts"}
    if not words:
        return {}
    counts = ", ".join(f"(SELECT count(*) FROM entries_fts WHERE entries_fts MATCH :d{i})"
                       for i in words)
    row = (await run(conn, f"SELECT {counts}", {f"d{i}": m for i, m in words.items()})).one()
    return dict(zip(words, row, strict=True))


async def _sqlite_ranking(conn, terms: list[Term], pairs: list[str], scope: _Scope, now,
                          window: int, when: tuple[float, float] | None = None,
                          answers: bool = False):
    params: dict = {"now": now, "w": _per_term(window, len(terms))}
    where = _filters(params, scope, "sqlite", answers)
    sparse = []
    if scope.ids is not None and scope.rows ** 2 < SPARSE * params["w"] * scope.total:
        # A sparse scope: most matches lie outside it, and joining each to its entry to
        # find out would cost the whole history for a common word. Test the match's id
        # against the scope's entry ids instead (collected once by ix_entries_conversation_id;
        # `+` keeps FTS5 from turning the list into one index lookup per id), and walk
        # only the index's stretch between the scope's first and last entry: an old scope
        # then never reads the newer history at all.
        ids = "SELECT id FROM entries WHERE conversation_id IN (SELECT value FROM json_each(:cids))"
        lo, hi = (await run(conn, (f"SELECT min(id), max(id) FROM ({ids})"),
                                     {"cids": params["cids"]})).one()
        if lo is None:
            raise _NoMatch("an empty scope")
        params.update(lo=lo, hi=hi)
        sparse = [f"+m.id IN ({ids})", "m.id BETWEEN :lo AND :hi"]
    branches, required = [], 0
    fts = await fts_relevance.totals(conn)
    sources = [await _sqlite_source(conn, t) for t in terms]
    df = await _index_df(conn, sources) if scope.ids is not None and fts.ln else {}
    for i, (t, source) in enumerate(zip(terms, sources, strict=True)):
        if source is None:
            if t.quoted:
                raise _NoMatch(t.text)
            continue
        required += t.quoted
        table, match = source
        params[f"m{i}"] = match
        head = (f"SELECT e.id AS id, e.kind AS kind, e.created_at AS created_at, "
                f"e.author AS author, {{rel}} AS rel, {int(t.quoted)} AS req FROM ")
        if not table:  # a LIKE filter: the newest entries are walked and tested
            branches.append(head.format(rel="0.0") + f"entries AS e WHERE {' AND '.join(where)} "
                            f"AND e.text LIKE :m{i} ESCAPE '\\' ORDER BY e.id DESC LIMIT :w")
            continue
        # The index drives, newest match first (CROSS JOIN fixes the order; FTS5 yields
        # rowids in descending order itself): entries are read by primary key, for
        # matching rows only, until the window is full; bm25() only for those rows.
        # In `entries_fts`, relevance is re-weighed for chat (store/fts_relevance.py): a
        # long turn is not buried under short ones, and a word is as rare as it is where
        # the search looks.
        cond = " AND ".join(["m.id = e.id", *where, *sparse])
        rel = "m.rel" if table != "entries_fts" else fts_relevance.relevance(
            "m.rel", "e.text", "e.author", fts.avg_tokens)
        branch = (head.format(rel=rel) + f"(SELECT rowid AS id, -bm25({table}) AS rel "
                  f"FROM {table} WHERE {table} MATCH :m{i}) AS m CROSS JOIN entries AS e "
                  f"WHERE {cond} ORDER BY m.id DESC LIMIT :w")
        if i in df:
            branch = fts_relevance.scoped(
                branch, "rel", fts_relevance.index_idf(fts.rows, df[i]), scope.rows,
                df[i] * scope.rows / max(fts.rows, 1))
        branches.append(branch)
    if when is not None:
        params.update(since=when[0], until=when[1], tw=TIME_ROWS)
        branches.append(_window_branch(where))
    if not branches:
        raise _NoMatch("no term can match")
    phrase = None
    if pairs:
        params["phrase"] = " OR ".join(_fts_string(p) for p in pairs)
        phrase = "w.id IN (SELECT rowid FROM entries_fts WHERE entries_fts MATCH :phrase)"
    score = _score_sql("w.rel", phrase, _author_sql(params, terms), when is not None)
    return (f"SELECT w.id AS id, {score} AS score "
            f"FROM ({_summed(branches, required, '')}) AS w"), params


async def _postgresql_orders(conn, params: dict, where: list[str], scope: _Scope,
                             window: int, queries: list[tuple[str, str]]) -> list[str]:
    """For each term's (tsquery, its words without positions): how to collect its newest
    matches. Walk the entries newest first ("e.id DESC", stopping at the window; the
    planner may still prefer the GIN index) or take every match the GIN index yields and
    sort them ("e.id + 0 DESC": no index has that order, so the planner cannot walk).

    The planner cannot tell. It prices `@@` like a comparison, while each costs ~0.3 us,
    and assumes a word is spread evenly over the history: for a word in 0.2% of 10^6
    entries, or a name last said years ago, it walked most of the table (0.2-0.4 s) where
    the index has the 2000 matches (3 ms). And GIN keeps no positions, so it estimates a
    phrase like its words ANDed: "and have" looks common when the phrase is rare. So
    measure, in one query for all terms: the newest PROBE_ROWS entries in scope, where a
    walk starts, show how dense each term is there (rows a walk reads per match) and how
    dense its words are (rows the index yields and rechecks, over the whole store)."""
    if scope.rows <= PROBE_ROWS:
        return ["e.id DESC"] * len(queries)  # the whole scope is this small: any plan is cheap
    counts = []
    for i, (q, qa) in enumerate(queries):
        params.update({f"pq{i}": q, f"pa{i}": qa})
        counts += [f"count(*) FILTER (WHERE r.tsv @@ CAST(:pq{i} AS tsquery))",
                   f"count(*) FILTER (WHERE r.tsv @@ CAST(:pa{i} AS tsquery))"]
    row = (await run(conn, (
        f"SELECT {', '.join(counts)}, count(*) FROM (SELECT e.search_vec AS tsv FROM entries "
        f"AS e WHERE {' AND '.join(where)} ORDER BY e.id DESC LIMIT :k) AS r"),
        {**params, "k": PROBE_ROWS})).one()
    seen = row[-1]
    if seen < PROBE_ROWS:
        return ["e.id DESC"] * len(queries)
    orders = []
    for i in range(len(queries)):
        hits, candidates = row[2 * i], row[2 * i + 1]
        walk = min(window * seen / max(hits, 1), scope.rows)  # rows read to fill the window
        recheck = 6 * candidates * scope.total / seen  # the index's matches, ~6x the cost
        orders.append("e.id + 0 DESC" if recheck < walk else "e.id DESC")
    return orders


def _pg_tsquery(t: Term, i: int, params: dict) -> str:
    """SQL for a term's tsquery: the text through the same configurations as the index
    (a word also unstemmed, as a speaker's name is indexed), never tsquery syntax."""
    params[f"t{i}"] = t.text
    fold = f"steward_search_fold(:t{i})"
    if t.phrase or t.cjk or t.quoted:
        return f"phraseto_tsquery('english', {fold})"
    if t.prefix:  # letters and digits only (parse_query): safe before ':*'
        parts = [f"to_tsquery('english', {fold} || ':*')", f"to_tsquery('simple', {fold} || ':*')"]
        for k, short in enumerate(_truncations(t.text)):
            params[f"t{i}_{k}"] = short
            parts.append(f"phraseto_tsquery('simple', steward_search_fold(:t{i}_{k}))")
        return "(" + " || ".join(parts) + ")"
    return (f"(SELECT CASE WHEN numnode(v.s) = 0 OR v.s = v.e THEN v.e WHEN numnode(v.e) = 0 "
            f"THEN v.s ELSE v.e || v.s END FROM (SELECT phraseto_tsquery('english', {fold}) AS e,"
            f" phraseto_tsquery('simple', {fold}) AS s) AS v)")


_SHARES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # engine: (when, shares)


async def _pg_shares(conn) -> dict[str, float]:
    """The share of indexed entries that contain each common lexeme (ANALYZE's most common
    elements of `search_vec`, at most 10 x the statistics target of them), read at most
    every `SHARES_SECONDS` per engine: planning a query on pg_stats costs milliseconds."""
    engine = conn.engine.sync_engine
    cached = _SHARES.get(engine)
    if cached is not None and time.monotonic() - cached[0] < SHARES_SECONDS:
        return cached[1]
    row = (await run(conn, (
        "SELECT CAST(CAST(most_common_elems AS text) AS text[]), most_common_elem_freqs "
        "FROM pg_stats WHERE schemaname = current_schema() AND tablename = 'entries' AND "
        "attname = 'search_vec'"))).first()
    shares = dict(zip(row[0], row[1], strict=False)) if row and row[0] else {}
    _SHARES[engine] = (time.monotonic(), shares)
    return shares


def _lexemes(q: str) -> list[str]:
    return [lx.replace("''", "'") for lx in _LEXEME.findall(q)]


async def _postgresql_ranking(conn, terms: list[Term], pairs: list[str], scope: _Scope, now,
                              window: int, when: tuple[float, float] | None = None,
                              answers: bool = False):
    params: dict = {}
    columns = []
    for i, t in enumerate(terms):
        columns.append(f"CAST({_pg_tsquery(t, i, params)} AS text)")
        # Without positions: what the GIN index can answer alone (a phrase's plan probe).
        columns.append(f"CAST(plainto_tsquery('english', steward_search_fold(:t{i})) AS text)")
    for k, pair in enumerate(pairs):
        params[f"pair{k}"] = pair
        columns.append(f"CAST(phraseto_tsquery('english', steward_search_fold(:pair{k})) AS text)")
    # Document frequency: counted in each term's window; for a word in more entries than
    # the window, at least what ANALYZE's statistics say (ts_typanalyze's lexeme shares).
    per_term, n = _per_term(window, len(terms)), max(scope.rows, 1)
    shares = await _pg_shares(conn) if n > per_term else {}
    row = (await run(conn, (f"SELECT {', '.join(columns)}"), params)).one() \
        if columns else ()
    phrases = [f"({p})" for p in row[2 * len(terms):2 * len(terms) + len(pairs)] if p]
    found = [(t, row[2 * i], row[2 * i + 1]) for i, t in enumerate(terms) if row[2 * i]]
    if any(t.quoted and not row[2 * i] for i, t in enumerate(terms)) or not (found or when):
        raise _NoMatch("no term can match")
    # asyncpg prepares statements, and after five runs PostgreSQL may switch to a generic
    # plan that cannot see how selective this query's words are (and scans): plan each
    # search for its own words, for the rest of this transaction. And from an index:
    # on a small table the planner prefers reading it all, not pricing in that `@@` on
    # every row costs more than the GIN index's few matches.
    await run(conn, ("SELECT set_config('plan_cache_mode', 'force_custom_plan', true), "
                            "set_config('enable_seqscan', 'off', true)"))
    params = {"now": now, "w": per_term, "n": float(n)}
    where = _filters(params, scope, "postgresql", answers)
    boost = ""
    if phrases:
        params["p"] = " | ".join(phrases)
        boost = "e.search_vec @@ CAST(:p AS tsquery)"
    orders = await _postgresql_orders(conn, dict(params), where, scope, per_term,
                                      [(q, qa if t.phrase or t.cjk else q)
                                       for t, q, qa in found]) if found else []
    branches = []
    for i, ((t, q, _), order) in enumerate(zip(found, orders, strict=True)):
        params[f"q{i}"] = q
        floor = 0.0
        if not (t.quoted or t.prefix):
            floor = n * max((shares.get(lx, 0.0) for lx in _lexemes(q)), default=0.0)
        params[f"f{i}"] = floor
        cond = " AND ".join([f"e.search_vec @@ CAST(:q{i} AS tsquery)", *where])
        window_sql = (f"SELECT e.id AS id, e.kind AS kind, e.created_at AS created_at, "
                      f"e.author AS author, "
                      f"CAST(ts_rank('{{1,1,1,1}}', e.search_vec, CAST(:q{i} AS tsquery), 1) "
                      f"AS double precision) AS r, {boost or 'false'} AS boost "
                      f"FROM entries AS e WHERE {cond} ORDER BY {order} LIMIT :w")
        # idf = ln(1 + (N - df + 0.5) / (df + 0.5)) = ln((N + 1) / (df + 0.5)), df <= N
        df = (f"greatest(CAST(count(*) OVER () AS double precision), "
              f"CAST(:f{i} AS double precision))")
        idf = f"ln((greatest(CAST(:n AS double precision), {df}) + 1.0) / ({df} + 0.5))"
        branches.append(f"SELECT t.id, t.kind, t.created_at, t.author, t.r * ({idf}) AS rel, "
                        f"t.boost, {int(t.quoted)} AS req FROM ({window_sql}) AS t")
    if when is not None:
        params.update(since=when[0], until=when[1], tw=TIME_ROWS)
        branches.append(_window_branch(where, ", false AS boost"))
    relevance = _summed(branches, sum(t.quoted for t, _, _ in found),
                        ", bool_or(u.boost) AS boost")
    score = _score_sql("w.rel", "w.boost" if boost else None, _author_sql(params, terms),
                       when is not None)
    return (f"SELECT w.id AS id, {score} AS score FROM ({relevance}) AS w"), params


async def _ranking(conn, dialect: str, terms: list[Term], scopes, conversation_id, now,
                   window: int, when: tuple[float, float] | None = None,
                   answers: bool = False):
    scope = await _scope(conn, scopes, conversation_id)
    looked_up, pairs = query_terms(terms), _pairs(terms)
    if dialect != "postgresql":
        return await _sqlite_ranking(conn, looked_up, pairs, scope, now, window, when, answers)
    return await _postgresql_ranking(conn, looked_up, pairs, scope, now, window, when, answers)


async def _neighbours(conn, found: list[Entry], context: int) -> dict:
    """{(entry id, "before"|"after"): [entries]}: up to `context` readable entries each side
    of every hit, by cursor on (conversation, seq), all in one round trip."""
    if context <= 0 or not found:
        return {}
    kinds = ", ".join(f"'{k}'" for k in NEIGHBOUR_KINDS)
    pages, params = [], {"k": context}
    for n, e in enumerate(found):
        params.update({f"c{n}": e.conversation_id, f"s{n}": e.seq, f"h{n}": e.id})
        for side, cond, order in (("before", "<", "DESC"), ("after", ">", "ASC")):
            pages.append(
                f"SELECT * FROM (SELECT {ENTRY_COLUMNS}, CAST(:h{n} AS BIGINT) AS hit, "
                f"'{side}' AS side FROM entries WHERE conversation_id = :c{n} "
                f"AND kind IN ({kinds}) AND text != '' AND seq {cond} :s{n} "
                f"ORDER BY seq {order} LIMIT :k) AS p{n}{side}")
    out: dict = {}
    for i in range(0, len(pages), _UNION_MAX):  # SQLite allows 500 terms in a compound
        for row in (await run(conn, " UNION ALL ".join(pages[i:i + _UNION_MAX]),
                              params)).all():
            out.setdefault((row.hit, row.side), []).append(entry_from_row(row))
    return {key: sorted(page, key=lambda n: n.seq) for key, page in out.items()}


async def ranked(conn, dialect: str, query: str, *, scopes: list[str] | None,
                 conversation_id: int | None, limit: int, offset: int, now: float,
                 candidates: int = MAX_CANDIDATES,
                 when: tuple[float, float] | None = None,
                 answers: bool = False) -> list[tuple[int, float]]:
    """(entry id, score) of one page of `query`'s lexical ranking, best first (see
    `search`; `answers`: Steward's own answers and summaries count too).

    Quotes are tolerant: when no entry holds a quoted text exactly (people misquote
    titles), its words count like any other, and the order of neighbouring ones still
    weighs (the phrase boost)."""
    terms = parse_query(query)
    if (not terms and when is None) or limit <= 0 or scopes == []:
        return []

    async def page(terms: list[Term], limit: int, offset: int) -> list[tuple[int, float]]:
        try:
            sql, params = await _ranking(conn, dialect, terms, scopes, conversation_id, now,
                                         candidates, when, answers)
        except _NoMatch:
            return []
        params.update(limit=limit, offset=max(0, offset))
        rows = (await run(conn, (
            f"{sql} ORDER BY score DESC, id DESC LIMIT :limit OFFSET :offset"), params)).all()
        return [(r.id, float(r.score)) for r in rows]

    found = await page(terms, limit, offset)
    if found or not any(t.quoted for t in terms) or (offset > 0 and await page(terms, 1, 0)):
        return found
    return await page(_loosened(terms), limit, offset)


def _loosened(terms: list[Term]) -> list[Term]:
    """Quoted terms as their words, a long word by its first letters (`LOOSE_PREFIX`, a
    prefix): a misspelt end ("Cartografer") still finds the word."""
    out: list[Term] = []
    for t in terms:
        if not t.quoted or t.cjk:
            out.append(t if not t.quoted else Term(t.text))
            continue
        for word in t.text.split():
            body = _trim(word)
            if len(body) > LOOSE_PREFIX and body.isalnum():
                out.append(Term(body[:LOOSE_PREFIX], prefix=True))
            elif body:
                out.append(Term(body))
    return out


async def search(conn, dialect: str, query: str, *, scopes: list[str] | None,
                 conversation_id: int | None, limit: int, offset: int, now: float,
                 context: int = 1, candidates: int = MAX_CANDIDATES,
                 when: tuple[float, float] | None = None) -> list[Hit]:
    """One page of ranked hits for `query`, best first.

    `scopes`: only conversations whose scope is listed (None: no restriction; an empty
    list: nothing). `conversation_id`: only that conversation (not its fork ancestors).
    `now`: the clock for recency. `context`: neighbours read each side of a hit.
    `candidates`: how many of the newest matches are ranked at most. `when`: the
    question's time (unix seconds, [since, until)): what was said then weighs
    `TIME_BOOST` times more, and is ranked even without a matching word."""
    found = await ranked(conn, dialect, query, scopes=scopes, conversation_id=conversation_id,
                         limit=limit, offset=offset, now=now, candidates=candidates, when=when)
    return await hits_for(conn, found, context)


async def hits_for(conn, found: list[tuple[int, float]], context: int,
                   answers: bool = False) -> list[Hit]:
    """`Hit`s for (entry id, score) pairs, in their order, with `context` neighbours
    (what people said; with `answers` also Steward's answers)."""
    if not found:
        return []
    order = [_Ranked(i, s) for i, s in found]
    ids = {f"i{n}": r.id for n, r in enumerate(order)}
    columns = ", ".join(f"e.{c.strip()}" for c in ENTRY_COLUMNS.split(","))
    rows = (await run(conn, (
        f'SELECT {columns}, c."key" AS conversation_key FROM entries AS e '
        "JOIN conversations AS c ON c.id = e.conversation_id "
        f"WHERE e.id IN ({', '.join(':' + k for k in ids)})"), ids)).all()
    by_id = {r.id: (entry_from_row(r), r.conversation_key) for r in rows}
    order = [r for r in order if r.id in by_id and evidence(by_id[r.id][0], answers)]
    near = await _neighbours(conn, [by_id[r.id][0] for r in order], context)
    return [Hit(by_id[r.id][0], by_id[r.id][1], float(r.score),
                tuple(near.get((r.id, "before"), ())), tuple(near.get((r.id, "after"), ())))
            for r in order]


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
    params.update(limit=10, offset=0)
    prefix = "EXPLAIN" if dialect == "postgresql" else "EXPLAIN QUERY PLAN"
    rows = (await run(conn, (
        f"{prefix} {sql} ORDER BY score DESC, id DESC LIMIT :limit OFFSET :offset"),
        params)).all()
    return "\n".join(" ".join(str(v) for v in r) for r in rows)
