"""The store's own reads. SQLite: on reader threads (store/read/pool.py), a read is one job
on a thread of its own connection, sees one snapshot, never writes, never waits for the
writer, and fails alone. PostgreSQL: lookups are autocommitted and never pinged, so a
connection the server dropped is found by the read itself, which is sent again."""

import asyncio
import sqlite3
import threading

import pytest
from sqlalchemy import select, text

from store import NotFound, Writes, open_store
from store.read.pool import SqliteReaders
from store.schema import conversations

sqlite_only = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
postgres_only = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)


@sqlite_only
async def test_the_stores_reads_run_on_its_reader_threads(store):
    conv = await store.ensure_conversation("k")
    writes = Writes()
    writes.append(conv.id, "user", "hello")
    await store.commit(writes)
    seen = []

    async def where(conn):
        seen.append(threading.current_thread().name)
        return (await conn.execute(select(conversations.c.last_seq))).scalar()

    assert await store._read(where) == 1
    assert seen[0].startswith("steward-sqlite-reader")
    assert [e.text for e in await store.entries_page(conv.id)] == ["hello"]
    with pytest.raises(NotFound):  # raised on the reader thread, heard here
        await store.get_task("missing")


@sqlite_only
async def test_a_read_sees_one_snapshot_while_the_writer_commits(store):
    conv = await store.ensure_conversation("k")
    landed = threading.Event()
    go_on = threading.Event()

    async def twice(conn):
        before = (await conn.execute(text("SELECT last_seq FROM conversations"))).scalar()
        go_on.set()
        landed.wait(10)  # the writer commits between the two statements of this read
        after = (await conn.execute(text("SELECT last_seq FROM conversations"))).scalar()
        return before, after

    reading = asyncio.create_task(store._read(twice))
    await asyncio.to_thread(go_on.wait, 10)
    writes = Writes()
    writes.append(conv.id, "user", "meanwhile")
    await store.commit(writes)  # WAL: the reader holds no lock the writer waits for
    landed.set()
    assert await reading == (0, 0)
    assert (await store.get_conversation("k")).last_seq == 1


@sqlite_only
async def test_a_read_cannot_write(store):
    async def sneak(conn):
        await conn.execute(text("DELETE FROM conversations"))

    await store.ensure_conversation("k")
    with pytest.raises(Exception, match="readonly|read-only|attempt to write"):
        await store._read(sneak)
    assert (await store.get_conversation("k")).key == "k"


async def test_more_reads_than_threads_all_finish_and_a_failing_one_fails_alone(tmp_path):
    path = tmp_path / "r.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (n INTEGER)")
    db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    db.commit()
    db.close()
    readers = SqliteReaders(lambda: sqlite3.connect(path, isolation_level=None,
                                                    check_same_thread=False), max_threads=3)
    names = set()

    def reading(i):
        async def read(conn):
            names.add(threading.current_thread().name)
            if i == 7:
                raise ValueError("this one")
            return (await conn.execute(text("SELECT sum(n) FROM t WHERE n < :i"),
                                       {"i": i})).scalar()
        return read

    try:
        results = await asyncio.gather(*(readers.run(reading(i)) for i in range(50)),
                                       return_exceptions=True)
    finally:
        await readers.close()
    assert isinstance(results[7], ValueError)
    assert [r for i, r in enumerate(results) if i != 7] == \
        [sum(range(i)) if i else None for i in range(50) if i != 7]
    assert 1 <= len(names) <= 3
    assert not any(t.name.startswith("steward-sqlite-reader") and t.is_alive()
                   for t in threading.enumerate() if t.name in names)


async def test_a_reader_that_cannot_open_fails_the_read_with_the_reason(tmp_path):
    def broken():
        raise sqlite3.OperationalError("unable to open database file")

    readers = SqliteReaders(broken, max_threads=2)
    try:
        async with asyncio.timeout(10):  # never a hang
            with pytest.raises(sqlite3.OperationalError, match="unable to open"):
                await readers.run(lambda conn: conn.execute(text("SELECT 1")))
    finally:
        await readers.close()


async def test_a_store_on_a_file_reads_through_its_readers_and_closes_them(tmp_path):
    before = set(threading.enumerate())
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 's.db'}")
    await store.ensure_conversation("k")
    await store.get_conversation("k")
    threads = [t for t in set(threading.enumerate()) - before
               if t.name.startswith("steward-sqlite-reader")]
    assert threads
    await store.close()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)


@postgres_only
async def test_a_read_whose_connection_the_server_dropped_is_sent_again(store):
    await store.ensure_conversation("k")

    async def backend(conn):
        return (await conn.execute(text("SELECT pg_backend_pid()"))).scalar()

    pid = await store._read(backend)  # the lookup connection now idle in the pool
    async with store.engines.write.connect() as conn:
        assert (await conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                ).scalar()
    assert await store._read(backend) != pid


@postgres_only
async def test_a_lookup_whose_connection_the_server_dropped_is_sent_again(store):
    """Lookups (store/read/queries.py on the hot path's asyncpg connections) the same."""
    await store.ensure_conversation("k")

    async def backend(conn):
        return (await conn.execute("SELECT pg_backend_pid() AS pid")).scalar()

    pid = await store._lookup(backend)  # its connection now idle in the hot pool
    async with store.engines.write.connect() as conn:
        assert (await conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                ).scalar()
    assert (await store.get_conversation("k")).key == "k"
    assert await store._lookup(backend) != pid


def _counting(store, method: str) -> list[int]:
    """Count the calls of one of the store's `fn`-taking seams (`_lookup`, `_write`)."""
    calls = [0]
    inner = getattr(store, method)

    async def counted(fn):
        calls[0] += 1
        return await inner(fn)

    setattr(store, method, counted)
    return calls


async def test_a_known_conversation_is_read_once_and_its_positions_when_asked(store):
    """What never changes in a conversation (key, owner, scope) is read once per store; its
    positions are read again whenever `get_conversation_by_id` is asked."""
    made = await store.ensure_conversation("slack:C1:1.0", owner="U1", scope="private:U1")
    reads = _counting(store, "_lookup")
    first = await store.known_conversation(made.id)
    assert (first.key, first.owner, first.scope, reads[0]) == ("slack:C1:1.0", "U1",
                                                               "private:U1", 1)
    writes = Writes()
    writes.append(made.id, "user", "hello")
    await store.commit(writes)
    again = await store.known_conversation(made.id)
    assert (again.key, again.last_seq, reads[0]) == ("slack:C1:1.0", 0, 1)  # not read again
    assert (await store.get_conversation_by_id(made.id)).last_seq == 1
    assert ((await store.known_conversation(made.id)).last_seq, reads[0]) == (1, 2)
    with pytest.raises(NotFound):
        await store.known_conversation(made.id + 1)


async def test_ensuring_a_conversation_that_exists_is_a_lookup_not_a_write(store):
    """Every inbound message ensures its conversation: one that exists is looked up, with
    no write transaction (on the acknowledgement's path); a new one is made once."""
    writes = _counting(store, "_write")
    made = await store.ensure_conversation("slack:C1:1.0", owner="U1")
    assert writes[0] == 1
    again = await store.ensure_conversation("slack:C1:1.0", owner="someone else")
    assert (again.id, again.owner, writes[0]) == (made.id, "U1", 1)
    both = await asyncio.gather(*(store.ensure_conversation("new") for _ in range(3)))
    assert len({c.id for c in both}) == 1


async def _listings(source, conv_id: int) -> dict:
    return {"tasks": await source.list_tasks(),
            "pending": await source.list_tasks(state="pending", limit=2),
            "schedules": await source.list_schedules(),
            "active": await source.list_schedules(state="active"),
            "quarantined": await source.list_submissions(state="quarantined"),
            "email": await source.list_submissions(channel="email", limit=1),
            "spend": await source.spend_report(0.0, day_offset=3600.0),
            "conversation": await source.get_conversation_by_id(conv_id)}


async def test_the_listings_of_the_reading_commands(store, store_url, tmp_path):
    """`steward tasks`, `schedules`, `quarantine` and `usage` list what the store holds; on
    an SQLite file the standard library's reader (store/read/reader.py) lists the same."""
    from store.read.reader import open_reader
    from store.records import UsageRecord
    from store.writes import ScheduleWrite

    ana = await store.ensure_conversation("cli:ana", owner="ana")
    w = Writes()
    spawned = [w.spawn("kind.a", {"i": i}, conversation_id=ana.id) for i in range(3)]
    w.submit("email", "<m1@x>", conversation_id=ana.id)
    w.quarantine("email", "<bad@x>", "malformed MIME", payload={"size": 3})
    w.quarantine("slack", "Ev1", "forged signature")
    for model, cost in (("m1", 0.5), ("m2", 0.25), ("m1", 1.0)):
        w.record_usage(UsageRecord(provider="p", model=model, input_tokens=3,
                                   output_tokens=5, cost_usd=cost, conversation_id=ana.id))
    w.record_usage(UsageRecord(provider="p", model="m1", cost_usd=2.0))
    for sid, state in (("s1", "active"), ("s2", "cancelled")):
        w.save_schedule(ScheduleWrite(id=sid, name=f"n-{sid}", prompt="stretch",
                                      trigger={"every": 60}, timezone="UTC",
                                      deliver={"channel": "cli"}, next_fire_at=1e9,
                                      conversation_id=ana.id, owner="ana", state=state))
    await store.commit(w)
    listed = await _listings(store, ana.id)
    assert [t.id for t in listed["tasks"]] == sorted(spawned)
    assert len(listed["pending"]) == 2
    assert [s.id for s in listed["schedules"]] == ["s1", "s2"]
    assert [s.id for s in listed["active"]] == ["s1"]
    assert listed["schedules"][0].trigger == {"every": 60}
    assert [(q["channel"], q["external_id"], q["reason"]) for q in listed["quarantined"]] == [
        ("slack", "Ev1", "forged signature"), ("email", "<bad@x>", "malformed MIME")]
    assert [q["external_id"] for q in listed["email"]] == ["<bad@x>"]
    assert [(r["owner"], r["model"], r["calls"], r["input_tokens"], r["cost"])
            for r in listed["spend"]] == [(None, "m1", 1, 0, 2.0), ("ana", "m1", 2, 6, 1.5),
                                          ("ana", "m2", 1, 3, 0.25)]
    assert listed["conversation"].key == "cli:ana"
    if not store_url.startswith("sqlite"):
        return
    reader = await open_reader(store_url)
    assert reader is not None  # a file at this build's schema
    try:
        assert await _listings(reader, ana.id) == listed
    finally:
        await reader.close()
