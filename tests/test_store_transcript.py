"""The store's transcript side: conversations, entries and forks, submissions, one-commit
atomicity, the usage ledger and migrations. Every test runs on SQLite and PostgreSQL."""

import pytest
from alembic.config import Config as AlembicConfig
from alembic.script import ScriptDirectory
from sqlalchemy import text

from store import (
    PENDING,
    RUNNING,
    DocumentError,
    LeaseLost,
    NotFound,
    TaskUpdate,
    UsageRecord,
    Writes,
    conversation_namespace,
    open_store,
)
from store.engine import MIGRATIONS, create_engines, migrate

# --- helpers ---------------------------------------------------------------------------------


async def append_entries(store, conversation_id: int, texts) -> list[int]:
    """One commit per text; returns the positions they got."""
    seqs = []
    for t in texts:
        w = Writes()
        w.append(conversation_id, "user", t)
        seqs.extend((await store.commit(w)).entry_seqs)
    return seqs


async def all_entries(store, conversation_id: int) -> list:
    return await store.entries_page(conversation_id, limit=10_000)


async def texts_of(store, conversation_id: int) -> list[str]:
    return [e.text for e in await all_entries(store, conversation_id)]


async def count_rows(store, table: str) -> int:
    async with store.engines.read.connect() as conn:
        return (await conn.execute(text(f"select count(*) from {table}"))).scalar_one()


async def get_task_or_none(store, task_id: str):
    try:
        return await store.get_task(task_id)
    except NotFound:
        return None


# --- conversations ---------------------------------------------------------------------------


async def test_ensure_conversation_twice_returns_the_same_conversation(store):
    first = await store.ensure_conversation("cli:alice", owner="alice", meta={"tz": "UTC"})
    second = await store.ensure_conversation("cli:alice", owner="someone-else")
    assert second.id == first.id
    assert second.owner == "alice"
    assert second.meta == {"tz": "UTC"}
    assert await store.get_conversation("cli:alice") == first
    assert len(await store.list_conversations()) == 1


async def test_get_conversation_of_a_missing_key_raises_not_found(store):
    with pytest.raises(NotFound):
        await store.get_conversation("cli:nobody")


async def test_list_conversations_pages_newest_first_by_before_id(store):
    made = [await store.ensure_conversation(f"cli:c{n}") for n in range(7)]
    pages, before = [], None
    while True:
        page = await store.list_conversations(limit=3, before_id=before)
        if not page:
            break
        pages.append(page)
        before = page[-1].id
    assert [len(p) for p in pages] == [3, 3, 1]
    listed = [c.id for p in pages for c in p]
    assert listed == [c.id for c in reversed(made)]


# --- entries ---------------------------------------------------------------------------------


async def test_entry_positions_are_one_to_n_in_commit_order(store):
    conv = await store.ensure_conversation("cli:seq")
    seqs = await append_entries(store, conv.id, [f"m{n}" for n in range(5)])
    assert seqs == [1, 2, 3, 4, 5]
    entries = await all_entries(store, conv.id)
    assert [(e.seq, e.text) for e in entries] == [(n + 1, f"m{n}") for n in range(5)]
    assert (await store.get_conversation("cli:seq")).last_seq == 5


async def test_several_entries_in_one_commit_get_consecutive_positions(store):
    conv = await store.ensure_conversation("cli:batch")
    other = await store.ensure_conversation("cli:other")
    await append_entries(store, conv.id, ["first"])
    w = Writes()
    w.append(conv.id, "user", "question", author="alice", data={"n": 1}, ref="r1")
    w.append(other.id, "user", "elsewhere")
    w.append(conv.id, "assistant", "answer")
    w.append(conv.id, "tool_result", "result", data=[1, 2])
    result = await store.commit(w)
    assert result.entry_seqs == [2, 1, 3, 4]
    entries = await all_entries(store, conv.id)
    assert [(e.seq, e.kind, e.text) for e in entries] == [
        (1, "user", "first"), (2, "user", "question"), (3, "assistant", "answer"),
        (4, "tool_result", "result")]
    assert (entries[1].author, entries[1].data, entries[1].ref) == ("alice", {"n": 1}, "r1")
    assert entries[3].data == [1, 2]
    assert [e.seq for e in await all_entries(store, other.id)] == [1]


async def test_entries_page_defaults_to_the_newest_entries_in_chronological_order(store):
    conv = await store.ensure_conversation("cli:page")
    await append_entries(store, conv.id, [f"m{n}" for n in range(1, 11)])
    page = await store.entries_page(conv.id, limit=4)
    assert [e.seq for e in page] == [7, 8, 9, 10]
    assert await store.entries_page((await store.ensure_conversation("cli:empty")).id) == []


async def test_entries_page_walks_the_whole_transcript_in_both_directions(store):
    conv = await store.ensure_conversation("cli:long")
    # 250 entries in 25 commits of 10, so the walk is not tied to commit boundaries.
    for batch in range(25):
        w = Writes()
        for n in range(10):
            w.append(conv.id, "user", f"m{batch * 10 + n + 1}")
        await store.commit(w)

    backward, pages, before = [], 0, None
    while page := await store.entries_page(conv.id, before=before, limit=40):
        assert [e.seq for e in page] == sorted(e.seq for e in page)
        backward[:0] = page
        before = page[0].seq
        pages += 1
    assert pages == 7
    assert [e.seq for e in backward] == list(range(1, 251))

    forward, pages, after = [], 0, 0
    while page := await store.entries_page(conv.id, after=after, limit=40):
        forward.extend(page)
        after = page[-1].seq
        pages += 1
    assert pages == 7
    assert [e.seq for e in forward] == list(range(1, 251))
    assert [e.text for e in forward] == [f"m{n}" for n in range(1, 251)]


# --- forks -----------------------------------------------------------------------------------


async def test_fork_sees_parent_entries_up_to_the_fork_point_then_its_own(store):
    parent = await store.ensure_conversation("cli:parent")
    await append_entries(store, parent.id, [f"p{n}" for n in range(1, 6)])
    fork = await store.fork("cli:parent", "cli:fork", at_seq=3)
    assert (fork.parent_id, fork.fork_at, fork.last_seq) == (parent.id, 3, 3)

    await append_entries(store, parent.id, ["p6"])
    assert await append_entries(store, fork.id, ["f4", "f5"]) == [4, 5]

    assert [(e.seq, e.text) for e in await all_entries(store, fork.id)] == [
        (1, "p1"), (2, "p2"), (3, "p3"), (4, "f4"), (5, "f5")]
    assert await texts_of(store, parent.id) == ["p1", "p2", "p3", "p4", "p5", "p6"]
    # Cursor pages in a fork cross from its own entries into the parent's.
    assert [e.text for e in await store.entries_page(fork.id, before=5, limit=2)] == [
        "p3", "f4"]
    assert [e.text for e in await store.entries_page(fork.id, after=2, limit=2)] == [
        "p3", "f4"]


async def test_fork_defaults_to_the_parent_latest_position(store):
    await store.ensure_conversation("cli:parent")
    parent = await store.get_conversation("cli:parent")
    await append_entries(store, parent.id, ["a", "b"])
    fork = await store.fork("cli:parent", "cli:fork")
    assert fork.fork_at == 2
    assert await texts_of(store, fork.id) == ["a", "b"]


async def test_fork_of_a_fork_before_and_after_the_first_fork_point(store):
    root = await store.ensure_conversation("cli:root")
    await append_entries(store, root.id, [f"r{n}" for n in range(1, 11)])
    first = await store.fork("cli:root", "cli:first", at_seq=6)
    await append_entries(store, first.id, [f"f{n}" for n in range(7, 11)])

    early = await store.fork("cli:first", "cli:early", at_seq=4)
    late = await store.fork("cli:first", "cli:late", at_seq=8)
    await append_entries(store, early.id, ["e5"])
    await append_entries(store, late.id, ["l9"])

    assert await texts_of(store, early.id) == ["r1", "r2", "r3", "r4", "e5"]
    assert await texts_of(store, late.id) == [
        "r1", "r2", "r3", "r4", "r5", "r6", "f7", "f8", "l9"]
    assert await texts_of(store, first.id) == [
        "r1", "r2", "r3", "r4", "r5", "r6", "f7", "f8", "f9", "f10"]
    assert await texts_of(store, root.id) == [f"r{n}" for n in range(1, 11)]
    # The late fork pages correctly across three conversations.
    assert [e.text for e in await store.entries_page(late.id, before=9, limit=3)] == [
        "r6", "f7", "f8"]


async def test_fork_does_not_copy_entries(store):
    parent = await store.ensure_conversation("cli:parent")
    await append_entries(store, parent.id, [f"p{n}" for n in range(20)])
    assert await count_rows(store, "entries") == 20
    fork = await store.fork("cli:parent", "cli:fork", at_seq=15)
    await store.fork("cli:fork", "cli:fork2", at_seq=10)
    assert await count_rows(store, "entries") == 20
    await append_entries(store, fork.id, ["own"])
    assert await count_rows(store, "entries") == 21


@pytest.mark.parametrize("at_seq", [-1, 4])
async def test_fork_point_outside_the_transcript_raises_value_error(store, at_seq):
    parent = await store.ensure_conversation("cli:parent")
    await append_entries(store, parent.id, ["a", "b", "c"])
    with pytest.raises(ValueError):
        await store.fork("cli:parent", "cli:fork", at_seq=at_seq)
    with pytest.raises(NotFound):
        await store.get_conversation("cli:fork")


async def test_fork_of_a_missing_conversation_raises_not_found(store):
    with pytest.raises(NotFound):
        await store.fork("cli:nobody", "cli:fork")


# --- submissions -----------------------------------------------------------------------------


def step_with_submission(conv, channel: str, *external_ids: str, label: str) -> Writes:
    """An inbound message being accepted: its entry, a task to answer it, a document edit."""
    w = Writes()
    w.submit(channel, *external_ids, conversation_id=conv.id, payload={"label": label})
    w.append(conv.id, "user", label)
    w.spawn("reply", {"label": label}, conversation_id=conv.id)
    w.edit_document(conversation_namespace(conv.id), "seen",
                    [{"op": "set", "path": [label], "value": True}], conversation_id=conv.id)
    return w


async def test_duplicate_submission_writes_nothing_of_its_step(store):
    conv = await store.ensure_conversation("slack:T:C:1")
    first = await store.commit(step_with_submission(conv, "slack", "Ev1", label="one"))
    assert not first.duplicate
    assert first.entry_seqs == [1]

    again = step_with_submission(conv, "slack", "Ev1", label="two")
    spawned = again.tasks[0].id
    second = await store.commit(again)

    assert second.duplicate
    assert (second.entry_seqs, second.task_ids, second.document_versions) == ([], [], {})
    assert await texts_of(store, conv.id) == ["one"]
    assert (await store.get_conversation(conv.key)).last_seq == 1
    assert await get_task_or_none(store, spawned) is None
    assert [t.inputs for t in await store.list_tasks()] == [{"label": "one"}]
    doc = await store.read_document(conversation_namespace(conv.id), "seen")
    assert (doc.version, doc.value) == (1, {"one": True})
    state = await store.submission_state("slack", "Ev1")
    assert state["state"] == "accepted"
    assert state["payload"] == '{"label":"one"}'
    assert await count_rows(store, "submissions") == 1


async def test_duplicate_detection_survives_reopening_the_store(store_url):
    store = await open_store(store_url)
    try:
        conv = await store.ensure_conversation("email:<a@b>")
        assert not (await store.commit(step_with_submission(conv, "email", "uid:7:42",
                                                            label="one"))).duplicate
    finally:
        await store.close()

    store = await open_store(store_url)
    try:
        conv = await store.get_conversation("email:<a@b>")
        result = await store.commit(step_with_submission(conv, "email", "uid:7:42",
                                                         label="two"))
        assert result.duplicate
        assert await texts_of(store, conv.id) == ["one"]
        assert len(await store.list_tasks()) == 1
    finally:
        await store.close()


async def test_submission_is_duplicate_when_only_its_second_external_id_is_known(store):
    conv = await store.ensure_conversation("email:<root>")
    await store.commit(step_with_submission(conv, "email", "<msg-1@x>", label="one"))

    result = await store.commit(step_with_submission(conv, "email", "uid:9:1", "<msg-1@x>",
                                                     label="two"))
    assert result.duplicate
    # The first id, inserted before the second was found known, was rolled back too.
    assert await store.submission_state("email", "uid:9:1") is None
    assert await texts_of(store, conv.id) == ["one"]


async def test_same_external_id_on_another_channel_is_not_a_duplicate(store):
    conv = await store.ensure_conversation("cli:multi")
    await store.commit(step_with_submission(conv, "slack", "X1", label="one"))
    result = await store.commit(step_with_submission(conv, "email", "X1", label="two"))
    assert not result.duplicate
    assert await texts_of(store, conv.id) == ["one", "two"]
    assert (await store.submission_state("email", "X1"))["state"] == "accepted"


async def test_quarantine_records_the_reason_and_is_deduped(store):
    w = Writes()
    w.quarantine("email", "uid:1:5", "unparseable MIME", payload={"size": 10})
    assert not (await store.commit(w)).duplicate
    state = await store.submission_state("email", "uid:1:5")
    assert (state["state"], state["reason"]) == ("quarantined", "unparseable MIME")

    w = Writes()
    w.quarantine("email", "uid:1:5", "another reason")
    assert (await store.commit(w)).duplicate
    # A later accept of the same item is a duplicate as well: it is never retried.
    conv = await store.ensure_conversation("email:<q>")
    assert (await store.commit(step_with_submission(conv, "email", "uid:1:5",
                                                    label="late"))).duplicate
    assert (await store.submission_state("email", "uid:1:5"))["reason"] == "unparseable MIME"
    assert await count_rows(store, "submissions") == 1


# --- atomicity -------------------------------------------------------------------------------


async def test_a_document_op_that_does_not_apply_rolls_back_the_whole_commit(store):
    conv = await store.ensure_conversation("cli:atomic")
    ns = conversation_namespace(conv.id)
    base = Writes()
    base.edit_document(ns, "notes", [{"op": "set", "path": ["a"], "value": 1}],
                       conversation_id=conv.id)
    await store.commit(base)

    w = Writes()
    w.append(conv.id, "user", "hello")
    w.append(conv.id, "assistant", "hi")
    task_id = w.spawn("reply", {})
    w.submit("cli", "req-1", conversation_id=conv.id)
    w.record_usage(UsageRecord("anthropic", "m", input_tokens=5))
    w.edit_document(ns, "notes", [{"op": "set", "path": ["b"], "value": 2}],
                    conversation_id=conv.id)
    w.edit_document(ns, "notes", [{"op": "delete", "path": ["missing"]}],
                    conversation_id=conv.id)
    with pytest.raises(DocumentError):
        await store.commit(w)

    assert await all_entries(store, conv.id) == []
    assert (await store.get_conversation(conv.key)).last_seq == 0
    assert await get_task_or_none(store, task_id) is None
    assert await store.submission_state("cli", "req-1") is None
    assert (await store.usage_totals())["calls"] == 0
    doc = await store.read_document(ns, "notes")
    assert (doc.version, doc.value) == (1, {"a": 1})
    # The submission was not consumed: the same request can be accepted later.
    w = Writes()
    w.submit("cli", "req-1", conversation_id=conv.id)
    w.append(conv.id, "user", "hello")
    assert (await store.commit(w)).entry_seqs == [1]


async def test_a_failing_edit_of_a_new_document_leaves_no_document(store):
    w = Writes()
    w.edit_document("ns", "fresh", [{"op": "delete", "path": ["nope"]}])
    with pytest.raises(DocumentError):
        await store.commit(w)
    with pytest.raises(NotFound):
        await store.read_document("ns", "fresh")
    assert await count_rows(store, "documents") == 0


async def test_a_lost_lease_rolls_back_the_entries_of_the_same_commit(store):
    conv = await store.ensure_conversation("cli:lease")
    w = Writes()
    task_id = w.spawn("reply", {}, conversation_id=conv.id)
    await store.commit(w)
    [claimed] = await store.claim_tasks("worker-a", 1, lease_seconds=60)
    assert claimed.id == task_id

    w = Writes()
    w.append(conv.id, "assistant", "answer from a worker that lost its lease")
    w.spawn("child", {}, parent_id=task_id)
    w.update_task(TaskUpdate(task_id, owner="worker-b", state="done", phase="end"))
    with pytest.raises(LeaseLost):
        await store.commit(w)

    assert await all_entries(store, conv.id) == []
    assert [t.id for t in await store.list_tasks()] == [task_id]
    task = await store.get_task(task_id)
    assert (task.state, task.lease_owner) == (RUNNING, "worker-a")


async def test_a_task_update_by_the_lease_holder_lands_with_its_entries(store):
    conv = await store.ensure_conversation("cli:lease-ok")
    w = Writes()
    task_id = w.spawn("reply", {}, conversation_id=conv.id)
    await store.commit(w)
    await store.claim_tasks("worker-a", 1, lease_seconds=60)

    w = Writes()
    w.append(conv.id, "assistant", "answer")
    w.update_task(TaskUpdate(task_id, owner="worker-a", state=PENDING, phase="sent",
                             checkpoint={"step": 2}))
    assert (await store.commit(w)).entry_seqs == [1]
    task = await store.get_task(task_id)
    assert (task.state, task.phase, task.checkpoint, task.lease_owner) == (
        PENDING, "sent", {"step": 2}, None)


# --- usage ledger ----------------------------------------------------------------------------


async def test_usage_rows_land_with_the_commit_failed_attempts_included(store):
    conv = await store.ensure_conversation("cli:usage")
    w = Writes()
    w.append(conv.id, "assistant", "answer")
    w.record_usage(UsageRecord("anthropic", "claude", input_tokens=0, output_tokens=0,
                               ok=False, error="HTTP 529 overloaded",
                               conversation_id=conv.id))
    w.record_usage(UsageRecord("anthropic", "claude", input_tokens=1200, output_tokens=300,
                               cache_read_tokens=800, cost_usd=0.0125,
                               conversation_id=conv.id))
    await store.commit(w)
    w = Writes()
    w.record_usage(UsageRecord("openai", "gpt", input_tokens=100, output_tokens=50,
                               cost_usd=0.0025))
    await store.commit(w)

    totals = await store.usage_totals()
    assert (totals["calls"], totals["input_tokens"], totals["output_tokens"]) == (3, 1300, 350)
    assert totals["cost_usd"] == pytest.approx(0.015)
    async with store.engines.read.connect() as conn:
        failed = (await conn.execute(text(
            "select provider, error, cache_read_tokens from usage where not ok"))).all()
    assert [tuple(r) for r in failed] == [("anthropic", "HTTP 529 overloaded", 0)]


async def test_usage_totals_of_an_empty_ledger_are_zero(store):
    totals = await store.usage_totals()
    assert totals == {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0}


# --- migrations ------------------------------------------------------------------------------


def _head() -> str:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg).get_current_head()


HEAD = _head()


async def test_opening_the_same_store_twice_is_idempotent(store_url):
    first = await open_store(store_url)
    try:
        conv = await first.ensure_conversation("cli:kept")
        await append_entries(first, conv.id, ["kept"])
    finally:
        await first.close()
    second = await open_store(store_url)
    try:
        assert await texts_of(second, conv.id) == ["kept"]
        async with second.engines.read.connect() as conn:
            versions = (await conn.execute(
                text("select version_num from alembic_version"))).scalars().all()
        assert versions == [HEAD]
    finally:
        await second.close()


async def test_a_database_from_the_first_release_upgrades_with_its_data(store_url):
    engines = create_engines(store_url)
    try:
        await migrate(engines, "0001")  # as written by the first release
        async with engines.write.begin() as conn:
            await conn.execute(text(
                "insert into conversations (key, last_seq, meta, created_at, updated_at)"
                " values ('cli:old', 1, '{}', 0, 0)"))
            await conn.execute(text(
                "insert into entries (conversation_id, seq, kind, text, created_at)"
                " select id, 1, 'user', 'from long ago', 0 from conversations"))
    finally:
        await engines.dispose()
    store = await open_store(store_url)  # upgrades to head
    try:
        conv = await store.get_conversation("cli:old")
        assert [e.text for e in await store.entries_page(conv.id)] == ["from long ago"]
        assert await store.list_schedules() == []  # a later revision's table exists
    finally:
        await store.close()


async def test_a_delivery_reserves_its_key_and_is_created_once(store):
    conv = await store.ensure_conversation("cli:deliveries")
    first = Writes()
    task_id = first.deliver("reply", {"text": "hi"}, key="msg-1", conversation_id=conv.id)
    result = await store.commit(first)
    assert result.task_ids == [task_id]
    task = await store.get_task(task_id)
    assert (task.idem_key, task.state) == ("msg-1", "pending")  # stored before any send

    again = Writes()
    again.deliver("reply", {"text": "hi"}, key="msg-1", conversation_id=conv.id)
    assert (await store.commit(again)).task_ids == [task_id]  # same key: the same delivery
    assert len(await store.list_tasks(kind="reply")) == 1

    fresh = Writes()
    other = fresh.deliver("reply", {"text": "hello"})
    await store.commit(fresh)
    assert (await store.get_task(other)).idem_key  # a key is reserved even when not given


async def test_a_nul_character_is_stored_as_a_replacement_on_every_backend(store):
    # PostgreSQL text refuses NUL; a mail or a message carrying one must not fail its step
    # forever (and block what comes after it).
    conv = await store.ensure_conversation("email:<nul\x00@x>")
    w = Writes()
    w.submit("email", "<id\x00@x>", conversation_id=conv.id)
    w.append(conv.id, "user", "before\x00after", author="a\x00b", ref="r\x00")
    task_id = w.spawn("echo", {"text": "in\x00puts"}, conversation_id=conv.id)
    assert not (await store.commit(w)).duplicate
    [entry] = await store.entries_page(conv.id, limit=10)
    assert (entry.text, entry.author, entry.ref) == ("before\ufffdafter", "a\ufffdb", "r\ufffd")
    assert (await store.get_task(task_id)).inputs == {"text": "in\x00puts"}  # JSON escapes it
    assert await store.submission_state("email", "<id\x00@x>") is not None
    assert (await store.get_conversation("email:<nul\x00@x>")).id == conv.id


async def test_sqlite_connections_are_durable_and_checked(tmp_path):
    # WAL (readers never block the writer), a full fsync per commit, foreign keys on, and
    # a busy timeout instead of an immediate "database is locked", on every connection.
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 's.db'}")
    try:
        for engine in (store.engines.write, store.engines.read):
            async with engine.connect() as conn:
                values = [(await conn.exec_driver_sql(f"PRAGMA {p}")).scalar()
                          for p in ("journal_mode", "synchronous", "foreign_keys",
                                    "busy_timeout")]
            assert values == ["wal", 2, 1, 30000]
    finally:
        await store.close()


async def test_unstorable_text_in_raw_statements_and_lone_surrogates(store):
    # A lone surrogate (JSON "\ud83d" decodes to one) cannot be encoded at all, and raw
    # statements (search, the import's dedupe) bind their strings themselves.
    conv = await store.ensure_conversation("cli:odd")
    w = Writes()
    w.submit("slack", "ev\x00\ud83d", conversation_id=conv.id)
    w.append(conv.id, "user", "broken \ud83d emoji and a\x00nul", author="x\ud800")
    assert not (await store.commit(w)).duplicate
    [entry] = await store.entries_page(conv.id, limit=5)
    assert entry.text == "broken ? emoji and a\ufffdnul" and entry.author == "x?"
    assert await store.known_submissions("slack", ["ev\x00\ud83d", "other"]) == {
        "ev\x00\ud83d"}
    # a query like any other, not an error: NUL and the surrogate are cleaned as stored
    assert [h.entry.seq for h in await store.search("a\x00nul \ud83d")] == [entry.seq]
    [hit] = await store.search("emoji")
    assert hit.entry.seq == entry.seq


async def test_slack_conversations_from_before_the_scope_rule_get_it(store_url):
    engines = create_engines(store_url)
    rows = {"slack:T:C1:17.5": "private:slack:T:UANA",  # a channel thread: shared now
            "slack:T:G9:18.1": "private:slack:T:UBOB",  # a group DM's thread: shared now
            "slack:T:D1": "private:slack:T:UANA",  # Ana's DM: stays hers
            "slack:T:D7": "private:local",  # a refused DM: no longer the terminal user's
            "slack:T:D7:19.2": "private:local",
            "cli:default": "private:local"}
    try:
        await migrate(engines, "0005")
        async with engines.write.begin() as conn:
            for key, scope in rows.items():
                await conn.execute(text(
                    "insert into conversations (key, last_seq, meta, scope, created_at, "
                    "updated_at) values (:key, 0, '{}', :scope, 0, 0)"),
                    {"key": key, "scope": scope})
    finally:
        await engines.dispose()
    store = await open_store(store_url)
    try:
        scopes = {key: (await store.get_conversation(key)).scope for key in rows}
    finally:
        await store.close()
    assert scopes == {"slack:T:C1:17.5": "channel:C1", "slack:T:G9:18.1": "channel:G9",
                      "slack:T:D1": "private:slack:T:UANA",
                      "slack:T:D7": "private:slack-dm:T:D7",
                      "slack:T:D7:19.2": "private:slack-dm:T:D7",
                      "cli:default": "private:local"}
