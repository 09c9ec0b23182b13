"""Migration 0008 re-indexes an existing history in place for ranked search: in batches, a
kill mid-way loses at most the batch in flight (SIGKILL for real, then the next open
continues after the last committed batch), two processes upgrading at once both finish,
the migrations produce store/schema.py, and its progress bar fits 80 columns. Every
test runs on SQLite and PostgreSQL."""

import asyncio
import importlib.util
import io
import os
import signal
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from store import Writes, open_store
from store.engine import MIGRATIONS, create_engines, migrate
from store.revision import HEAD  # the newest: 0008 and what came after it ran
from store.schema import SEARCH_INDEX, metadata
from tests.test_search import NOW, texts

TARGET = "I finally went to the new climbing gym on Saturday, my arms are dead"
ROWS = 300


def _searchable(i: int) -> bool:
    return i % 10 not in (7, 8)


def old_rows(n: int = ROWS) -> list[dict]:
    """A history as an older release wrote it: Anna and Bob talking, with a CJK line, and
    rows that must stay out of the index (system notes, search_history's own results)."""
    rows = []
    for i in range(1, n + 1):
        kind, data, author = "user", None, ("Anna" if i % 2 else "Bob")
        body = f"message {i} about the weather and the weekend"
        if i % 10 == 7:
            kind, data, author, body = "system", None, None, f"system note {i} about climbing"
        elif i % 10 == 8:
            kind, author = "tool_result", None
            data, body = '{"name":"search_history"}', f"earlier: climbing gym {i}"
        elif i == 101:
            body = TARGET
        elif i == 202:
            body = "去年的饺子很好吃"
        rows.append({"seq": i, "kind": kind, "author": author, "text": body, "data": data,
                     "t": 1_700_000_000 + i})
    return rows


async def write_old_history(store_url: str, revision: str, n: int = ROWS) -> None:
    engines = create_engines(store_url)
    try:
        await migrate(engines, revision)
        async with engines.write.begin() as conn:
            cid = (await conn.execute(text(
                "INSERT INTO conversations (key, owner, scope, last_seq, meta, created_at, "
                "updated_at) VALUES ('cli:old', 'anna', 'private:anna', :n, '{}', 0, 0) "
                "RETURNING id"), {"n": n})).scalar()
            await conn.execute(text(
                "INSERT INTO entries (conversation_id, seq, kind, author, text, data, "
                "created_at) VALUES (:cid, :seq, :kind, :author, :text, :data, :t)"),
                [{**r, "cid": cid} for r in old_rows(n)])
    finally:
        await engines.dispose()


async def scalar(store_url: str, sql: str):
    engines = create_engines(store_url)
    try:
        async with engines.read.connect() as conn:
            return (await conn.execute(text(sql))).scalar()
    finally:
        await engines.dispose()


def indexed_sql(dialect: str, table: str = "entries_fts") -> str:
    if dialect == "sqlite":
        return f"SELECT count(*) FROM {table}"
    return "SELECT count(*) FROM entries WHERE search_vec IS NOT NULL"


async def assert_ranked(store, n: int = ROWS) -> None:
    found = await store.search("When did Anna go to the climbing gym?", limit=5, at=NOW)
    assert found[0].entry.text == TARGET
    assert all(h.entry.kind == "user" for h in found)  # no system note, no search result
    assert await texts(store, "饺子") == ["去年的饺子很好吃"]
    assert len(await store.search("weather", limit=5000, at=NOW)) == sum(
        _searchable(i) for i in range(1, n + 1)) - 2  # all but the target and the CJK line


@pytest.mark.parametrize("revision", ["0006", "0007"])
async def test_a_database_written_before_0008_is_reindexed_and_ranked(store_url, revision,
                                                                      monkeypatch):
    await write_old_history(store_url, revision)
    monkeypatch.setenv("STEWARD_REINDEX_BATCH", "7")  # many batches, each committed
    store = await open_store(store_url)
    try:
        await assert_ranked(store)
        conv = await store.get_conversation("cli:old")
        w = Writes()
        w.append(conv.id, "user", "and the climbing gym again on Sunday", author="Bob",
                 created_at=NOW)
        await store.commit(w)  # written after the migration: indexed by the trigger
        assert (await texts(store, "what did Bob say about the climbing gym?"))[0] == \
            "and the climbing gym again on Sunday"
        searchable = sum(_searchable(i) for i in range(1, ROWS + 1)) + 1
        assert await scalar(store_url, indexed_sql(store.dialect)) == searchable
        assert await scalar(store_url, "SELECT version_num FROM alembic_version") == HEAD
    finally:
        await store.close()


ROOT = str(Path(__file__).resolve().parent.parent)
REINDEX = ("import asyncio, logging, sys; from store import open_store; "
           "logging.basicConfig(level=logging.INFO); asyncio.run(open_store(sys.argv[1]))")


async def reindex_process(store_url: str, **env) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", REINDEX, store_url, env={**os.environ, **env},
        cwd=ROOT, stderr=asyncio.subprocess.PIPE)


async def test_a_reindex_killed_midway_resumes_after_its_last_batch(store_url):
    await write_old_history(store_url, "0007")
    proc = await reindex_process(store_url, STEWARD_REINDEX_BATCH="50",
                                 STEWARD_KILL_AT="after-reindex-batch")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    dialect = "sqlite" if store_url.startswith("sqlite") else "postgresql"
    # one batch committed, nothing else of this revision: alembic still says 0007
    assert await scalar(store_url, "SELECT version_num FROM alembic_version") == "0007"
    done = await scalar(store_url, "SELECT done FROM search_reindex")
    first_id = await scalar(store_url, "SELECT min(id) FROM entries")
    assert done == first_id + 49
    new_table = "entries_fts_ranked"
    assert await scalar(store_url, indexed_sql(dialect, new_table)) == sum(
        _searchable(i) for i in range(1, 51))
    # a write by an older process meanwhile: the new trigger is committed, so it is indexed
    engines = create_engines(store_url)
    try:
        async with engines.write.begin() as conn:
            await conn.execute(text(
                "INSERT INTO entries (conversation_id, seq, kind, author, text, created_at) "
                "SELECT id, 1000, 'user', 'Bob', 'the zeppelin landed', 1800000000 "
                "FROM conversations"))
    finally:
        await engines.dispose()
    store = await open_store(store_url)  # resumes after `done`
    try:
        await assert_ranked(store)
        assert await texts(store, "zeppelin") == ["the zeppelin landed"]
        assert await scalar(store_url, indexed_sql(dialect)) == sum(
            _searchable(i) for i in range(1, ROWS + 1)) + 1  # every row once
        assert await scalar(store_url, "SELECT version_num FROM alembic_version") == HEAD
    finally:
        await store.close()


async def reindexed_so_far(store_url: str) -> int:
    try:
        return await scalar(store_url, "SELECT done FROM search_reindex") or 0
    except Exception:  # not created yet, or gone: the first batch is not committed
        return 0


async def test_two_processes_upgrading_at_once_both_finish(store_url):
    """The second opens the database while the first is between batches: they take turns,
    and the one beaten to the end (whichever it is) says so and exits 0 too."""
    await write_old_history(store_url, "0007", n=3000)
    first = await reindex_process(store_url, STEWARD_REINDEX_BATCH="10")
    for _ in range(6000):  # at most a minute
        if await reindexed_so_far(store_url):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the first process committed no batch within a minute")
    second = await reindex_process(store_url, STEWARD_REINDEX_BATCH="10")
    procs = [first, second]
    results = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 120)
    errors = [err.decode() for _, err in results]
    assert [p.returncode for p in procs] == [0, 0], errors
    assert sum("finished the migration to head meanwhile" in e for e in errors) == 1, errors
    store = await open_store(store_url)
    try:
        await assert_ranked(store, 3000)
        assert await scalar(store_url, indexed_sql(store.dialect)) == sum(
            _searchable(i) for i in range(1, 3001))
    finally:
        await store.close()


def _diff_name(diff) -> tuple[str, str]:
    """(table, object) of one compare_metadata difference."""
    op, *args = diff
    if op in ("add_table", "remove_table"):
        return args[0].name, args[0].name
    if op in ("add_index", "remove_index"):
        return args[0].table.name, args[0].name
    if op in ("add_column", "remove_column"):
        return args[1], args[2].name
    return "", repr(diff)


async def test_the_migrations_produce_the_schema(store_url):
    """What the migrations create is store/schema.py, table by table, column types
    included, plus the search index that schema.py names and leaves out (SEARCH_INDEX)."""
    engines = create_engines(store_url)
    try:
        await migrate(engines)
        async with engines.write.connect() as conn:
            diff = await conn.run_sync(lambda sync: compare_metadata(
                MigrationContext.configure(sync, opts={"compare_type": True}), metadata))
    finally:
        await engines.dispose()
    expected = SEARCH_INDEX[engines.dialect]
    names = [_diff_name(d) for d in diff]
    search = {obj for _table, obj in names if obj.startswith(expected)}
    assert set(expected) <= search  # the index exists...
    assert [n for n in names if n[1] not in search] == []  # ...and is all that differs


def test_the_progress_bar_fits_80_columns_and_redraws_in_place():
    spec = importlib.util.spec_from_file_location(
        "ranked_search", MIGRATIONS / "versions" / "0008_ranked_search.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    bar = module._Bar(0, 10**9, stream=out)
    for done in range(1, 6):
        bar.started -= 1.0  # as if time passed
        bar.last -= 1.0
        bar.update(done * 10**8, 123_456_789)
    bar.finish()
    *frames, summary = out.getvalue().split("\r\x1b[K")
    assert len(frames) == 6 and frames[0] == ""
    assert all(0 < len(f) <= 80 and "\n" not in f for f in frames[1:]), frames
    assert "50%" in frames[-1] and "re-indexing search" in frames[-1]
    assert summary.startswith("search index rebuilt: ") and summary.endswith(" s\n")
    quiet = io.StringIO()
    module._Bar(0, 10, stream=quiet).update(5, 5)
    assert quiet.getvalue() == ""  # not a terminal: silent
