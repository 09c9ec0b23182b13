"""Full-history search: a full-text index over the searchable entries, backfilled.

SQLite (FTS5), two indexes, both fed by one AFTER INSERT trigger on `entries`:

- `entries_fts`: external content over `entries.text`, tokenizer `unicode61
  remove_diacritics 2` — words for English, German and every other script that puts spaces
  between words; case and diacritics folded ("muller" finds "Müller"), `ß` kept as is.
- `entries_cjk`: contentless, tokenizer `trigram`, only for rows containing CJK (Chinese,
  Japanese, Korean) characters, which unicode61 cannot split into words (a whole sentence
  would be one token). Trigrams find any substring of 3+ characters; the text is indexed
  with two trailing spaces so that every 1- or 2-character substring is the start of some
  indexed trigram, which the query side finds through `entries_cjk_vocab` (fts5vocab: a
  range read of the index's term list) — so short CJK words such as 饺子 stay indexed too.

PostgreSQL: a generated `search_tsv` column, `to_tsvector('simple', steward_search_fold(
left(text, 100000)))`, with a GIN index. `steward_search_fold` (an IMMUTABLE SQL function,
used by the queries as well, so both sides fold the same way) strips diacritics from Latin
letters like unicode61 above (Unicode NFD, drop combining marks, NFC; `translate()` with a
table of accented letters was tried and is ~50x slower) and puts spaces around each CJK
character so that a CJK query becomes a phrase of adjacent characters — substring search,
fully indexed, for any length. The 100 000-character cap keeps a tsvector under its 1 MB
limit. No extension is needed (pg_trgm would not split CJK in a C-locale database, and
unaccent needs CREATE EXTENSION rights a deployment may not have).

Indexed kinds: user, assistant, tool_result and compaction (summaries), except the
results of the `search_history` tool itself (they only quote other entries). Queries
filter by kind as well.

Caution for later revisions: a batch ("move and copy") rebuild of `entries` on SQLite drops
its triggers; such a revision must recreate `entries_search_ai`.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Frozen copies: store/search.py routes queries by the same character class.
CJK_RANGES = ("\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
              "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f")
# Latin letters that may carry a diacritic (Latin-1 .. Extended-B, Extended Additional).
LATIN_ACCENTED = "\u00c0-\u024f\u1e00-\u1eff"
COMBINING_MARKS = "\u0300-\u036f"


def _searchable(row: str, find: str = "instr") -> str:
    """The SQL condition for an indexed row (`find`: SQLite's instr, PostgreSQL's strpos)."""
    return (f"({row}kind IN ('user', 'assistant', 'compaction') OR ({row}kind = 'tool_result'"
            f" AND {find}(coalesce({row}data, ''), '\"name\":\"search_history\"') = 0))")


def _upgrade_sqlite() -> None:
    has_cjk = f"text GLOB '*[{CJK_RANGES}]*'"
    op.execute("CREATE VIRTUAL TABLE entries_fts USING fts5(text, content='entries', "
               "content_rowid='id', tokenize='unicode61 remove_diacritics 2')")
    op.execute("CREATE VIRTUAL TABLE entries_cjk USING fts5(text, content='', "
               "tokenize='trigram')")
    op.execute("CREATE VIRTUAL TABLE entries_cjk_vocab USING fts5vocab(entries_cjk, 'row')")
    op.execute(f"""
        CREATE TRIGGER entries_search_ai AFTER INSERT ON entries WHEN {_searchable('new.')}
        BEGIN
            INSERT INTO entries_fts (rowid, text) VALUES (new.id, new.text);
            INSERT INTO entries_cjk (rowid, text)
                SELECT new.id, new.text || '  ' WHERE new.{has_cjk};
        END""")
    # Backfill what earlier releases wrote.
    op.execute("INSERT INTO entries_fts (rowid, text) SELECT id, text FROM entries "
               f"WHERE {_searchable('')} ORDER BY id")
    op.execute("INSERT INTO entries_cjk (rowid, text) SELECT id, text || '  ' FROM entries "
               f"WHERE {_searchable('')} AND {has_cjk} ORDER BY id")


def _upgrade_postgresql() -> None:
    utf8 = op.get_bind().exec_driver_sql("SHOW server_encoding").scalar() == "UTF8"
    # NFD, drop the combining marks, NFC (which puts Hangul syllables back together); only
    # for text with such letters: normalize() is not cheap (and needs a UTF8 database).
    unaccent = (f"CASE WHEN t ~ '[{LATIN_ACCENTED}]' THEN normalize(regexp_replace("
                f"normalize(t, NFD), '[{COMBINING_MARKS}]', '', 'g'), NFC) ELSE t END"
                if utf8 else "t")
    op.execute(f"""
        CREATE FUNCTION steward_search_fold(t text) RETURNS text
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
        AS $$ SELECT regexp_replace({unaccent}, '([{CJK_RANGES}])', ' \\1 ', 'g') $$""")
    # Adding a stored generated column computes it for every existing row: the backfill.
    op.execute(f"""
        ALTER TABLE entries ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS (
            CASE WHEN {_searchable('', 'strpos')}
            THEN to_tsvector('simple'::regconfig, steward_search_fold(left(text, 100000)))
            END) STORED""")
    op.execute("CREATE INDEX ix_entries_search ON entries USING gin (search_tsv)")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _upgrade_postgresql()
    else:
        _upgrade_sqlite()


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX ix_entries_search")
        op.execute("ALTER TABLE entries DROP COLUMN search_tsv")
        op.execute("DROP FUNCTION steward_search_fold(text)")
    else:
        op.execute("DROP TRIGGER entries_search_ai")
        op.execute("DROP TABLE entries_cjk_vocab")
        op.execute("DROP TABLE entries_cjk")
        op.execute("DROP TABLE entries_fts")
