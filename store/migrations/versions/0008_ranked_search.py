"""Ranked search: the full-text index rebuilt in place for natural-language questions.

What is indexed now (store/search.py has the ranking): each searchable entry's speaker name
(`entries.author`) followed by its text, so "what did Anna say about climbing" finds Anna's
turns; English stemming, so "climbing" finds "climbed".

- SQLite: `entries_fts` becomes a contentless FTS5 table (name and text are in no single
  column it could read back) with tokenizer `porter unicode61 remove_diacritics 2`: the
  Porter stemmer over 0004's words. `entries_cjk` (trigrams) and its vocabulary stay.
- PostgreSQL: a plain column `search_vec` (the `simple` configuration for the name, so a
  name is never stemmed, and `english` for the text, which also drops English stop words;
  both through 0004's `steward_search_fold`) filled on insert by the trigger
  `entries_search_bi` from the IMMUTABLE `steward_search_vector(kind, data, author, text)`,
  with the GIN index `ix_entries_search`. It replaces 0004's generated column `search_tsv`:
  PostgreSQL 15 cannot change a generated column's expression, and adding one rewrites the
  whole table in one statement, which could not be resumed.

How, without holding the history in memory or losing work to a kill:

1. start (with the migrations before it): the new index, the insert trigger that feeds it
   (from now on every new entry is indexed on insert), and one row in `search_reindex`:
   `mark`, the newest entry id at that moment (read after the trigger exists, so every
   older row is backfilled and every newer one was indexed by the trigger), `done` = 0.
2. batches of `STEWARD_REINDEX_BATCH` (default 5000) entries in id order, each in its own
   transaction with `done` moved to its last id. A process killed mid-way loses at most the
   batch in flight: alembic still says 0007, so the next open runs this revision again,
   and it continues after `done`.
3. swap (one transaction): SQLite drops the old `entries_fts` and renames the new table to
   it; PostgreSQL drops `search_tsv` (with its index) and builds `ix_entries_search` on
   `search_vec` in one CREATE INDEX (cheaper than maintaining GIN through the batches),
   then ANALYZEs `entries` (the search reads the lexeme statistics). `search_reindex` goes.

Commits inside a migration: store.engine runs all pending revisions in one transaction
(PostgreSQL: under an advisory transaction lock). Between batches this revision commits
through the driver, pauses a moment outside the lock (SQLite's busy handler polls rather
than queues, so a waiting writer gets its turn), and begins again (SQLite: BEGIN IMMEDIATE;
PostgreSQL: BEGIN and the same advisory lock), which SQLAlchemy does not track; the first
commit also commits the revisions before it. Only a history of more than one batch commits
at all. Another process opening the database meanwhile waits for the lock, reads 0007 and
runs this revision too: the two take turns on batches (each reads `done` under the lock).
The one that finds the swap made already was beaten to the end, and the rest of the
upgrade too (the swap commits with every later revision, in the winner's last
transaction): it raises `Beaten`, and store.engine's migrate rolls back and finds the
database at the revision it wanted.

On a terminal a progress bar (stderr, at most 80 columns, redrawn in place at most ten
times a second) shows the batches; elsewhere it is silent. `STEWARD_KILL_AT=after-reindex-
batch` kills the process after the first committed batch (as bot/runtime/killpoints.py
does; the crash tests use it).

Revision ID: 0008
Revises: 0007
"""

import os
import signal
import sys
import time

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# Frozen copies: store.engine's migration lock, 0004's CJK character class.
LOCK = 0x5354_4557
CJK_RANGES = ("\u2e80-\u2fdf\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
              "\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f\U00020000-\U0002fa1f")
NEW_FTS = "entries_fts_ranked"  # SQLite: the new index while it is being built
BAR_WIDTH = 24
PAUSE = 0.005  # seconds between batches without the lock: about a tenth of a default batch


def _batch_size() -> int:
    return max(1, int(os.environ.get("STEWARD_REINDEX_BATCH") or 5000))


def _searchable(row: str, find: str = "instr") -> str:
    """The SQL condition for an indexed row, as 0004 has it."""
    return (f"({row}kind IN ('user', 'assistant', 'compaction') OR ({row}kind = 'tool_result'"
            f" AND {find}(coalesce({row}data, ''), '\"name\":\"search_history\"') = 0))")


class _Bar:
    """One line on stderr if it is a terminal: share of the ids done, entries, rate, time
    left. Nothing is drawn in the first half second (a small history never shows one)."""

    def __init__(self, done: int, mark: int, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty())
        self.start, self.mark, self.rows = done, max(mark, 1), 0
        self.started = self.last = time.monotonic()
        self.drawn = False

    def update(self, done: int, rows: int) -> None:
        self.rows += rows
        t = time.monotonic()
        if not self.interactive or t - self.last < 0.1 or t - self.started < 0.5:
            return
        self.last = t
        share = min(done / self.mark, 1.0)
        filled = int(share * BAR_WIDTH)
        rate = self.rows / max(t - self.started, 1e-9)
        left = (self.mark - done) * (t - self.started) / max(done - self.start, 1)
        line = (f"re-indexing search [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share:4.0%}"
                f" {self.rows:,} entries {rate:,.0f}/s {int(left) // 60}:{int(left) % 60:02d}"
                f" left")
        self.stream.write("\r\x1b[K" + line[:80])
        self.stream.flush()
        self.drawn = True

    def finish(self) -> None:
        if self.drawn:
            self.stream.write(f"\r\x1b[Ksearch index rebuilt: {self.rows:,} entries in "
                              f"{time.monotonic() - self.started:.0f} s\n")
            self.stream.flush()


def _commit_and_continue(bind) -> None:
    """Make the work so far durable and go on in a new transaction under the same lock."""
    bind.exec_driver_sql("COMMIT")
    time.sleep(PAUSE)
    if bind.dialect.name == "postgresql":
        bind.exec_driver_sql("BEGIN")
        bind.exec_driver_sql(f"SELECT pg_advisory_xact_lock({LOCK})")
    else:
        bind.exec_driver_sql("BEGIN IMMEDIATE")


# -- SQLite -------------------------------------------------------------------------------


def _sqlite_trigger(table: str) -> str:
    has_cjk = f"text GLOB '*[{CJK_RANGES}]*'"
    return f"""
        CREATE TRIGGER entries_search_ai AFTER INSERT ON entries WHEN {_searchable('new.')}
        BEGIN
            INSERT INTO {table} (rowid, text)
                VALUES (new.id, coalesce(new.author || ' ', '') || new.text);
            INSERT INTO entries_cjk (rowid, text)
                SELECT new.id, new.text || '  ' WHERE new.{has_cjk};
        END"""


def _sqlite_state(bind) -> str:
    found = dict(bind.execute(sa.text(
        "SELECT name, sql FROM sqlite_master WHERE name IN ('search_reindex', 'entries_fts')"
    )).all())
    if "search_reindex" in found:
        return "building"
    return "built" if "porter" in (found.get("entries_fts") or "") else "old"


def _sqlite_start() -> None:
    op.execute(f"CREATE VIRTUAL TABLE {NEW_FTS} USING fts5(text, content='', "
               "tokenize='porter unicode61 remove_diacritics 2')")
    op.execute("DROP TRIGGER IF EXISTS entries_search_ai")
    op.execute(_sqlite_trigger(NEW_FTS))


def _sqlite_batch(bind, done: int, upper: int) -> None:
    bind.execute(sa.text(
        f"INSERT INTO {NEW_FTS} (rowid, text) SELECT id, coalesce(author || ' ', '') || text "
        f"FROM entries WHERE id > :done AND id <= :upper AND {_searchable('')} ORDER BY id"),
        {"done": done, "upper": upper})


def _sqlite_swap(_bind, _backfilled: bool) -> None:
    op.execute("DROP TRIGGER entries_search_ai")
    op.execute("DROP TABLE entries_fts")
    op.execute(f"ALTER TABLE {NEW_FTS} RENAME TO entries_fts")
    op.execute(_sqlite_trigger("entries_fts"))


# -- PostgreSQL ---------------------------------------------------------------------------


def _postgresql_state(bind) -> str:
    # Read from pg_class, not by to_regclass(): after waiting for the advisory lock, the
    # backend's catalog cache may not yet know that another process dropped the table.
    if bind.execute(sa.text(
            "SELECT count(*) FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = "
            "c.relnamespace WHERE c.relname = 'search_reindex' AND n.nspname = "
            "current_schema()")).scalar():
        return "building"
    columns = set(bind.execute(sa.text(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = "
        "current_schema() AND table_name = 'entries'")).scalars())
    return "built" if "search_vec" in columns and "search_tsv" not in columns else "old"


def _postgresql_start() -> None:
    op.execute("ALTER TABLE entries ADD COLUMN search_vec tsvector")
    op.execute(f"""
        CREATE FUNCTION steward_search_vector(kind text, data text, author text, body text)
        RETURNS tsvector LANGUAGE sql IMMUTABLE PARALLEL SAFE
        AS $$ SELECT CASE WHEN {_searchable('', 'strpos')} THEN
            to_tsvector('simple'::regconfig, steward_search_fold(coalesce(author, '')))
            || to_tsvector('english'::regconfig, steward_search_fold(left(body, 100000)))
        END $$""")
    op.execute("""
        CREATE FUNCTION entries_search_vec() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.search_vec := steward_search_vector(NEW.kind, NEW.data, NEW.author, NEW.text);
            RETURN NEW;
        END $$""")
    op.execute("CREATE TRIGGER entries_search_bi BEFORE INSERT ON entries FOR EACH ROW "
               "EXECUTE FUNCTION entries_search_vec()")


def _postgresql_batch(bind, done: int, upper: int) -> None:
    bind.execute(sa.text(
        "UPDATE entries SET search_vec = steward_search_vector(kind, data, author, text) "
        f"WHERE id > :done AND id <= :upper AND {_searchable('', 'strpos')}"),
        {"done": done, "upper": upper})


def _postgresql_swap(_bind, backfilled: bool) -> None:
    op.execute("ALTER TABLE entries DROP COLUMN search_tsv")  # and 0004's index with it
    op.execute("CREATE INDEX ix_entries_search ON entries USING gin (search_vec)")
    if backfilled:
        op.execute("ANALYZE entries")


# -- the revision -------------------------------------------------------------------------


def _engine(bind):
    if bind.dialect.name == "postgresql":
        return _postgresql_state, _postgresql_start, _postgresql_batch, _postgresql_swap
    return _sqlite_state, _sqlite_start, _sqlite_batch, _sqlite_swap


class Beaten(RuntimeError):
    """Another process finished this revision while this one waited for the lock."""

    def __init__(self):
        super().__init__("the search index was rebuilt by another process meanwhile")


def upgrade() -> None:
    bind = op.get_bind()
    state, start, batch, swap = _engine(bind)
    current = state(bind)
    if current == "built":
        raise Beaten()
    if current == "old":
        start()
        op.execute("CREATE TABLE search_reindex (id INTEGER PRIMARY KEY, done BIGINT NOT NULL,"
                   " mark BIGINT NOT NULL)")
        op.execute("INSERT INTO search_reindex (id, done, mark) "
                   "SELECT 1, 0, coalesce(max(id), 0) FROM entries")
    size, killed = _batch_size(), os.environ.get("STEWARD_KILL_AT") == "after-reindex-batch"
    done, mark = bind.execute(sa.text("SELECT done, mark FROM search_reindex")).one()
    bar, backfilled = _Bar(done, mark), mark > 0
    while done < mark:
        upper, rows = bind.execute(sa.text(
            "SELECT max(id), count(*) FROM (SELECT id FROM entries WHERE id > :done AND "
            "id <= :mark ORDER BY id LIMIT :n) AS b"), {"done": done, "mark": mark, "n": size}
        ).one()
        upper = mark if upper is None else upper
        batch(bind, done, upper)
        bind.execute(sa.text("UPDATE search_reindex SET done = :d"), {"d": upper})
        bar.update(upper, rows)
        if upper >= mark:
            break
        _commit_and_continue(bind)
        if killed:
            os.kill(os.getpid(), signal.SIGKILL)
        if state(bind) == "built":
            bar.finish()
            raise Beaten()
        done, mark = bind.execute(sa.text("SELECT done, mark FROM search_reindex")).one()
    swap(bind, backfilled)
    op.execute("DROP TABLE search_reindex")
    bar.finish()


def downgrade() -> None:
    """Back to 0004's index (rebuilt in one statement: a downgrade is rare)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER entries_search_bi ON entries")
        op.execute("DROP FUNCTION entries_search_vec()")
        op.execute("ALTER TABLE entries DROP COLUMN search_vec")
        op.execute("DROP FUNCTION steward_search_vector(text, text, text, text)")
        op.execute(f"""
            ALTER TABLE entries ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS (
                CASE WHEN {_searchable('', 'strpos')}
                THEN to_tsvector('simple'::regconfig, steward_search_fold(left(text, 100000)))
                END) STORED""")
        op.execute("CREATE INDEX ix_entries_search ON entries USING gin (search_tsv)")
        return
    has_cjk = f"text GLOB '*[{CJK_RANGES}]*'"
    op.execute("DROP TRIGGER entries_search_ai")
    op.execute("DROP TABLE entries_fts")
    op.execute("CREATE VIRTUAL TABLE entries_fts USING fts5(text, content='entries', "
               "content_rowid='id', tokenize='unicode61 remove_diacritics 2')")
    op.execute(f"""
        CREATE TRIGGER entries_search_ai AFTER INSERT ON entries WHEN {_searchable('new.')}
        BEGIN
            INSERT INTO entries_fts (rowid, text) VALUES (new.id, new.text);
            INSERT INTO entries_cjk (rowid, text)
                SELECT new.id, new.text || '  ' WHERE new.{has_cjk};
        END""")
    op.execute("INSERT INTO entries_fts (rowid, text) SELECT id, text FROM entries "
               f"WHERE {_searchable('')} ORDER BY id")
