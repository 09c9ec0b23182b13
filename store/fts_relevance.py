"""SQLite: FTS5's bm25() re-weighed for chat, as PostgreSQL's ranking already weighs it.

FTS5's bm25() fixes two things that suit documents, not conversations:

- Length: b = 0.75 divides a word's weight by nearly the turn's length over the average
  turn's. Chat turns are mostly a few words ("lol", "k", "same"), so a turn of forty words
  (a story, an answer with its reasons) weighed a third of "lol Anna" for the speaker's
  name, and a fifth for a word both said once. Here b is `LENGTH_B`: a longer turn still
  weighs less for the same word, by far less. (PostgreSQL: ts_rank's normalisation 1
  divides by 1 + log(length).)
- Rarity: the inverse document frequency is counted over the whole index, where a
  speaker's name is rare (one conversation of many) while in that conversation it is in
  every other turn. Within a scope, a term's document frequency is counted where the
  search looks, as on PostgreSQL: its matches in the window of newest matches, at least
  its share of the whole index times the scope's size.

Both adjust -bm25() of a term's own FTS5 query, which is idf × tf·(k1 + 1) / (tf + k1·(1 −
b + b·dl/avgdl)): divided by the index's idf and by the length term, times the scope's idf
and the length term with `LENGTH_B` (exact for a word said once in a turn, as words in chat
nearly always are). dl is estimated as the turn's words (spaces + 1, and the speaker's
name); N and avgdl are FTS5's own (its averages record, which bm25() reads too).

The scope's idf needs SQLite's `ln()` (SQLITE_ENABLE_MATH_FUNCTIONS, on in the usual
builds); without it the index's idf stays.
"""

import math
from dataclasses import dataclass

from store.read.plain import run

__all__ = ["LENGTH_B", "Totals", "index_idf", "relevance", "scoped", "totals"]

K1, FTS5_B = 1.2, 0.75  # FTS5's bm25() constants (fts5_aux.c)
LENGTH_B = 0.25
_LN: list[bool] = []  # whether SQLite has ln(): one library per process (sqlite3's)


@dataclass(frozen=True)
class Totals:
    """FTS5's own counts for `entries_fts`: indexed rows, mean tokens per row, and
    whether this SQLite has `ln()`."""

    rows: int
    avg_tokens: float
    ln: bool


def _varints(blob: bytes) -> list[int]:
    """SQLite varints (7 bits a byte, high bit: more follows), as FTS5 writes them."""
    out, value = [], 0
    for byte in blob:
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            out.append(value)
            value = 0
    return out


async def totals(conn) -> Totals:
    """Rows and mean length from FTS5's averages record (rowid 1 of `entries_fts_data`:
    the row count, then each column's token total), read in one primary-key lookup."""
    blob = (await run(conn, "SELECT block FROM entries_fts_data WHERE id = 1")).scalar()
    counts = _varints(bytes(blob or b""))
    rows = counts[0] if counts else 0
    avg = counts[1] / rows if len(counts) > 1 and rows else 1.0
    if not _LN:
        try:
            await run(conn, "SELECT ln(2.0)")
            _LN.append(True)
        except Exception:  # no math functions in this build: "no such function: ln"
            _LN.append(False)
    return Totals(rows, max(avg, 1e-9), _LN[0])


def _length_term(b: float, x: str) -> str:
    return f"(1.0 + {K1} * ({1.0 - b} + {b} * {x}))"


def relevance(rel: str, text: str, author: str, avg_tokens: float) -> str:
    """SQL: a term's -bm25() `rel` with the length normalisation of `LENGTH_B`."""
    words = (f"(length({text}) - length(replace({text}, ' ', '')) + 1 + "
             f"({author} IS NOT NULL))")
    x = f"({words} / {float(avg_tokens)!r})"
    return f"({rel} * {_length_term(FTS5_B, x)} / {_length_term(LENGTH_B, x)})"


def index_idf(rows: int, df: int) -> float:
    """The idf FTS5's bm25() used: ln((N − df + ½) / (df + ½)), at least 1e-6."""
    return max(math.log((rows - df + 0.5) / (df + 0.5)), 1e-6)


def scoped(branch: str, rel_column: str, idf: float, scope_rows: int, floor: float) -> str:
    """SQL: `branch` (one term's window of matches, newest first) with its relevance
    column's index idf swapped for the scope's: ln((n + 1) / (df + ½)), df the window's
    matches (at least `floor`, the term's share of the index times the scope's size)."""
    n = float(max(scope_rows, 1))
    return (f"SELECT t.id AS id, t.kind AS kind, t.created_at AS created_at, "
            f"t.author AS author, t.{rel_column} / {idf!r} * ln(({n!r} + 1.0) / "
            f"(min(max(count(*) OVER (), {float(floor)!r}), {n!r}) + 0.5)) AS rel, "
            f"t.req AS req FROM ({branch}) AS t")
