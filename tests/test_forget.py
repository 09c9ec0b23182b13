"""`steward forget`, on SQLite and PostgreSQL: a person with DMs, a shared channel, facts,
to-dos, attachments, embeddings (and SQLite's vector index file), schedules, budget notes,
quarantined and journalled events is forgotten; then search (the store's and `steward
search`), recall, facts, the inspector's pages, every row of every table and (SQLite) a raw
scan of the database, its -wal and every file of the home find none of their words, while
every word of another person is still there. A dry run changes nothing; without a terminal
and --yes it refuses; on SQLite it refuses while a runner holds the home's lock; a live
runner whose turn's conversation is forgotten goes on; `--session` takes one conversation
and what it wrote into a document that stays; a forget that stopped after its commit is
finished by the next one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import sys
from argparse import Namespace
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from sqlalchemy import text

from bot.agent import budget
from bot.agent.inbox import add_history, submit_message
from bot.app.config import load_config
from bot.app.forget import SLACK_JOURNAL, target_of
from bot.app.inspector.server import make_app
from bot.app.inspector.source import open_source
from bot.attachments.blobs import BlobStore
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, ToolCall
from bot.memory import embeddings as _embeddings
from bot.memory.facts import FACT_TOOLS, read_facts
from bot.memory.recall import recall
from bot.runtime.lock import RunnerLock
from store import TERMINAL, ScheduleWrite, Writes, vector_index
from store import forget as store_forget
from store import vectors as _vectors
from store.schema import metadata
from tests.fakes.agent_rig import rig_factory
from tests.fakes.embedding_server import hashed_embedding

ANNA, BOB = "slack:T1:UANNA", "slack:T1:UBOB"
GONE, KEPT = "zebrafish4411", "quokka7342"  # words only Anna / only Bob ever said
GONE_CJK, KEPT_CJK = "斑马鱼", "短尾矮袋鼠"  # the same, in the trigram index (CJK)
DM_ANNA, DM_BOB = "slack:T1:DANNA", "slack:T1:DBOB"
THREAD_BOB, THREAD_ANNA = "slack:T1:C1:100.1", "slack:T1:C1:200.1"  # in channel C1
FORK = THREAD_BOB + "@fork"
MODEL = "fake-hash-256"
TOKEN = "forget-test-inspector-token-0123"
ANNA_BLOB, SHARED_BLOB = f"{GONE} private notes".encode(), b"the shared picnic menu"


# -- the world ------------------------------------------------------------------------------


def script(request) -> Response:
    """"remember X" -> remember_fact, "todo X" -> the to-do list, a tool's result -> "Done.",
    anything else -> heard back (so the answers hold the asker's words too)."""
    last = request.messages[-1]
    if last.role == "tool":
        return Response(text="Done.")
    said = last.content
    if (m := re.match(r"remember (.+)", said)):
        return Response(text="", tool_calls=[ToolCall(id="f1", name="remember_fact",
                                                      arguments={"fact": m.group(1)})])
    if (m := re.match(r"todo (.+)", said)):
        return Response(text="", tool_calls=[ToolCall(id="t1", name="todo", arguments={
            "action": "add", "item": m.group(1)})])
    return Response(text=f"Heard: {said[:200]}")


class HashEmbedder(_embeddings.Embedder):
    """The fake embedding server's vectors, in process (recall's hybrid side)."""

    model, hybrid = MODEL, True

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return [hashed_embedding(t) for t in texts]


class World:
    def __init__(self, store, home: Path, rig):
        self.store, self.home, self.rig = store, home, rig
        self.blobs = BlobStore.of_home(home)
        self.n = 0

    async def say(self, key: str, person: str, text_: str, *, scope: str, data=None):
        """A Slack message as the connector submits it (its own ids, the member in the
        entry's data), answered by the real runner."""
        self.n += 1
        channel = key.split(":")[2]
        ts = f"{300 + self.n}.{self.n}"
        name = "Anna" if person == ANNA else "Bob"
        await submit_message(self.store, channel="cli", external_ids=[f"{channel}:{ts}"],
                             conversation_key=key, text=text_, author=name, owner=person,
                             scope=scope, data={"slack": {"channel": channel, "ts": ts,
                                                          "user": person.rsplit(":", 1)[1]},
                                                **(data or {})})
        await self.rig.run()
        return ts


def private(person: str) -> str:
    return f"private:{person}"


async def build(store, home: Path, make) -> World:
    rig = make(ScriptedModel(script), *FACT_TOOLS)
    world = World(store, home, rig)
    mine = await world.blobs.put(ANNA_BLOB)
    shared = await world.blobs.put(SHARED_BLOB)
    files = lambda *d: {"attachments": [{"blob": x, "name": "f.bin", "kind": "binary"}  # noqa: E731
                                        for x in d]}
    # Anna's DM: an attachment of her own and one Bob sent too, a fact, a to-do
    await world.say(DM_ANNA, ANNA, f"my fish is called {GONE}, {GONE_CJK}",
                    scope=private(ANNA), data=files(mine, shared))
    await world.say(DM_ANNA, ANNA, f"remember {GONE} is my favourite fish", scope=private(ANNA))
    await world.say(DM_ANNA, ANNA, f"todo buy {GONE} food", scope=private(ANNA))
    # Bob's DM
    await world.say(DM_BOB, BOB, f"my mascot is {KEPT}, {KEPT_CJK}", scope=private(BOB),
                    data=files(shared))
    await world.say(DM_BOB, BOB, f"remember {KEPT} is the team mascot", scope=private(BOB))
    # Bob's thread in channel C1: both of them, shared facts and to-dos
    shared_scope = "channel:C1"
    await world.say(THREAD_BOB, BOB, f"{KEPT} planning thread", scope=shared_scope)
    edited = await world.say(THREAD_BOB, ANNA, f"I bring {GONE} snacks", scope=shared_scope)
    await world.say(THREAD_BOB, ANNA, f"remember {GONE} likes the shared tank",
                    scope=shared_scope)
    await world.say(THREAD_BOB, ANNA, f"todo clean the {GONE} tank", scope=shared_scope)
    await world.say(THREAD_BOB, BOB, f"remember {KEPT} guards the tank", scope=shared_scope)
    await world.say(THREAD_BOB, BOB, f"todo polish the {KEPT} statue", scope=shared_scope)
    await add_history(store, channel="slack", conversation_key=THREAD_BOB, messages=[
        {"ref": f"C1:{edited}:edited:1", "author": "Anna",
         "text": f"(edited an earlier message; it now says:) {GONE} crackers",
         "data": {"slack_note": {"channel": "C1", "ts": edited}}},
        {"ref": "C1:299.1", "author": "Anna", "text": f"earlier {GONE} chatter",
         "data": {"slack": {"channel": "C1", "ts": "299.1", "user": "UANNA"}}}])
    await world.say(THREAD_BOB, BOB, f"{KEPT} closes the thread", scope=shared_scope)
    # Anna's own thread in C1 (Bob answered there: that goes with it)
    await world.say(THREAD_ANNA, ANNA, f"{GONE} question", scope=shared_scope)
    await world.say(THREAD_ANNA, BOB, "an answer from Bob", scope=shared_scope)
    await store.fork(THREAD_BOB, FORK)
    # schedules, budget notes, a quarantined event and a journalled one of each
    dm_anna = await store.get_conversation(DM_ANNA)
    dm_bob = await store.get_conversation(DM_BOB)
    w = Writes()
    for sid, who, conv, word in (("sch-anna", ANNA, dm_anna, GONE),
                                 ("sch-bob", BOB, dm_bob, KEPT)):
        w.save_schedule(ScheduleWrite(
            id=sid, name=f"{word} reminder", prompt=f"remind me about {word}",
            trigger={"kind": "cron", "expr": "0 9 * * mon"}, timezone="UTC",
            deliver={"channel": "cli"}, next_fire_at=4_000_000_000.0,
            conversation_id=conv.id, owner=who))
    w.submit(budget.NOTES, f"daily:2030-01-01:{ANNA}")
    w.submit(budget.NOTES, f"daily:2030-01-01:{BOB}")
    await store.commit(w)
    for n, user, word in ((1, "UANNA", GONE), (2, "UBOB", KEPT)):
        w = Writes()
        w.quarantine("slack", f"Ev000{n}", "could not be read", payload={
            "team_id": "T1", "event": {"user": user, "text": f"{word} broken"}})
        await store.commit(w)
        await store.journal_put("slack", f"Ev100{n}", {
            "team_id": "T1", "event": {"user": user, "text": f"{word} pending"}}, lease=60)
    await embed_all(store)
    return world


async def embed_all(store) -> None:
    async with store.engines.write.begin() as conn:
        rows = await _vectors.missing(conn, MODEL, after=0, limit=100_000)
        await _vectors.put(conn, store.dialect, MODEL, [
            (i, c, _vectors.pack(hashed_embedding(_vectors.embeddable_text(a, t))))
            for i, c, a, t in rows])


# -- reading it back --------------------------------------------------------------------------


async def every_row(store) -> str:
    """Every row of every table, as text (and the SQLite full-text index's vocabulary)."""
    out = []
    async with store.reading() as conn:
        for table in metadata.sorted_tables:
            rows = (await conn.execute(text(f'SELECT * FROM "{table.name}"'))).all()
            out += [repr(tuple(r)) for r in rows]
        if store.dialect == "sqlite":
            await conn.execute(text("CREATE VIRTUAL TABLE IF NOT EXISTS temp.fts_vocab "
                                    "USING fts5vocab(main, entries_fts, 'row')"))
            out += [r[0] for r in (await conn.execute(text(
                "SELECT term FROM temp.fts_vocab"))).all()]
    return "\n".join(out)


def raw_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def steward(home: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "XDG_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=env, cwd=home,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode(), err.decode()


async def inspector_pages(config, keys: list[str]) -> str:
    """Every page the inspector has for what is there: the index, each transcript, context
    and to-do list, the task list and every task, schedules, approvals, quarantine, usage."""
    async with open_source(config) as source:
        runner = web.AppRunner(make_app(source, token=TOKEN), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        pages = []
        try:
            async with httpx.AsyncClient(base_url=base, timeout=30,
                                         headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                paths = ["/", "/tasks", "/schedules?all=1", "/approvals", "/quarantine",
                         "/usage"]
                for key in keys:
                    paths += [f"/transcript?key={key}", f"/context?key={key}",
                              f"/document?key={key}&name=todo"]
                for t in await source.store.list_tasks(limit=10_000):
                    paths.append(f"/task?id={t.id}")
                for path in paths:
                    r = await http.get(path)
                    allowed = (200, 404) if path.startswith("/document") else (200,)
                    assert r.status_code in allowed, (path, r.status_code, r.text[:300])
                    pages.append(r.text)
        finally:
            await runner.cleanup()
    return "\n".join(pages)


async def index_keys(store) -> set[int]:
    """SQLite: the entry ids in the vector index file a search builds now (as a new
    process would: this one's open indexes forgotten first)."""
    await vector_index.idle()
    vector_index._OPEN.clear()
    async with store.reading() as conn:
        await _vectors.nearest(conn, "sqlite", MODEL, hashed_embedding(KEPT),
                               conversation_ids=None, k=3, window=1)
    await vector_index.idle()
    [ix] = vector_index._OPEN.values()
    assert ix.base is not None and ix.path is not None and ix.path.exists()
    return {int(k) for k in ix.base.keys}


@pytest.fixture
async def world(store, store_url, tmp_path, monkeypatch):
    monkeypatch.setattr(vector_index, "TAIL_MAX", 4)  # a search makes the index file
    home = tmp_path
    (home / "config.toml").write_text(f'[store]\nurl = "{store_url}"\n'
                                      '[llm]\nprovider = "scripted"\n')
    async with rig_factory(store, home) as make:
        w = await build(store, home, make)
    if store.dialect == "sqlite":
        def event(n, user, said):
            return {"event": {"event_id": f"Ev200{n}", "team_id": "T1",
                              "event": {"user": user, "text": said}}}

        (home / SLACK_JOURNAL).write_text("".join(json.dumps(line) + "\n" for line in (
            event(1, "UANNA", f"{GONE} taken in"), {"done": "Ev2001"},
            event(2, "UANNA", f"{GONE} not yet taken in"),
            event(3, "UBOB", f"{KEPT} not yet taken in"))))
    yield w
    await vector_index.idle()
    vector_index._OPEN.clear()


# -- the tests --------------------------------------------------------------------------------


async def test_a_forgotten_person_is_gone_everywhere_and_the_other_is_not(world, tmp_path):
    store, home = world.store, world.home
    config = load_config(str(home / "config.toml"), str(home), {}, home)
    bob_entries = await entries_by(store, "Bob", exclude=(THREAD_ANNA,))
    fork = await store.get_conversation(FORK)
    _embeddings.attach(store, HashEmbedder())
    try:
        assert GONE in await recall(store, fork, f"what about {GONE}?", in_window=set())
    finally:
        _embeddings.attach(store, None)
    anna_ids = await ids_saying(store, GONE)
    if store.dialect == "sqlite":
        assert anna_ids <= await index_keys(store)  # the index file holds her vectors

    assert await rate_places(store, ANNA) > 0  # her turns took places in her hourly rate
    before = await every_row(store)
    code, out, err = await steward(home, "forget", "--person", ANNA, "--dry-run")
    assert code == 0, err
    assert "Dry run: nothing was changed." in out
    assert DM_ANNA in out and THREAD_ANNA in out  # her conversations, listed by key
    assert THREAD_BOB in out and FORK in out  # her messages there are listed as going
    assert await every_row(store) == before
    assert (home / "blobs").exists() and BlobStore.of_home(home).path(
        hashlib.sha256(ANNA_BLOB).hexdigest()).exists()

    code, out, err = await steward(home, "forget", "--person", ANNA, "--yes")
    assert code == 0, err
    assert "Forgotten:" in out and "Older backups still hold what was forgotten" in out
    assert "Space reclaimed" in out

    # the raw files: the database, its -wal and -shm, the vector index, the blobs, the
    # Slack journal, everything in the home
    files = raw_files(tmp_path)
    assert not [p for p, data in files.items()
                if GONE.encode() in data or GONE_CJK.encode() in data]
    if store.dialect == "sqlite":
        db = Path(store.engines.write.url.database)
        assert files.get(db.with_name(db.name + "-wal"), b"") == b""  # cut to nothing
        assert KEPT.encode() in files[db] and KEPT_CJK.encode() in files[db]
        assert not list((db.parent / (db.name + "-vectors")).glob("*.usearch"))
        journal = files[home / SLACK_JOURNAL]  # Bob's event not taken in yet stays
        assert KEPT.encode() in journal and b"Ev2003" in journal and b"Ev2002" not in journal
    # every row of every table
    rows = await every_row(store)
    assert GONE not in rows and KEPT in rows
    for who in ("UANNA", ANNA):
        assert who not in rows, who
    assert "UBOB" in rows and BOB in rows
    assert await rate_places(store, ANNA) == 0 and await rate_places(store, BOB) > 0
    # the store's search, `steward search`, recall (with vectors), facts
    assert await store.search(GONE) == [] and await store.search(GONE_CJK) == []
    assert {h.conversation_key for h in await store.search(KEPT_CJK)} == {DM_BOB}
    assert {h.conversation_key for h in await store.search(KEPT, limit=50)} == {
        DM_BOB, THREAD_BOB}
    code, out, err = await steward(home, "search", GONE, "--json")
    assert (code, out) == (0, ""), err
    code, out, _ = await steward(home, "search", KEPT, "--json")
    assert code == 0 and len(out.splitlines()) >= 4
    fork = await store.get_conversation(FORK)
    _embeddings.attach(store, HashEmbedder())
    try:
        assert GONE not in await recall(store, fork, f"what about {GONE}?", in_window=set())
        assert KEPT in await recall(store, fork, f"what about {KEPT}?", in_window=set())
    finally:
        _embeddings.attach(store, None)
    assert await read_facts(store, private(ANNA)) == []
    assert [f["text"] for f in await read_facts(store, "channel:C1")] == [
        f"{KEPT} guards the tank"]
    assert [f["text"] for f in await read_facts(store, private(BOB))] == [
        f"{KEPT} is the team mascot"]
    code, out, _ = await steward(home, "facts", "--json")
    assert code == 0 and GONE not in out and KEPT in out
    # what stays is all there: Bob's every entry, his thread with a note where hers were
    assert await entries_by(store, "Bob", exclude=(THREAD_ANNA,)) == bob_entries
    thread = await store.get_conversation(THREAD_BOB)
    page = await store.entries_page(thread.id, limit=100)
    assert page[-1].kind == "system" and page[-1].data["forgotten"]
    assert {e.text for e in page if e.author == "Bob"} >= {f"{KEPT} planning thread",
                                                          f"{KEPT} closes the thread"}
    todo = await store.read_document(f"conversation:{thread.id}", "todo")
    assert [i["text"] for i in todo.value["items"]] == [f"polish the {KEPT} statue"]
    for key in (DM_ANNA, THREAD_ANNA):
        with pytest.raises(Exception, match="no conversation"):
            await store.get_conversation(key)
    assert [s.id for s in await store.list_schedules()] == ["sch-bob"]
    # the blobs: hers gone, the one Bob sent too kept
    assert not world.blobs.path(hashlib.sha256(ANNA_BLOB).hexdigest()).exists()
    assert world.blobs.path(hashlib.sha256(SHARED_BLOB).hexdigest()).exists()
    # the vectors: none of hers, a new index file without them
    if store.dialect == "sqlite":
        keys = await index_keys(store)
        assert keys and not keys & anna_ids
    async with store.reading() as conn:
        near = await _vectors.nearest(conn, store.dialect, MODEL, hashed_embedding(GONE),
                                      conversation_ids=None, k=50)
    assert near and not {n.id for n in near} & anna_ids
    # the inspector's pages
    keys = [c.key for c in await store.list_conversations(limit=100)]
    assert sorted(keys) == sorted([DM_BOB, THREAD_BOB, FORK])
    pages = await inspector_pages(config, keys)
    assert GONE not in pages and KEPT in pages
    # the record: what kind, whose (a digest), counts; no content
    [record] = await store_forget.records(store)
    assert (record.kind, record.target) == ("person", hashlib.sha256(ANNA.encode()).hexdigest())
    assert record.counts["conversations"] == 2 and record.counts["entries_elsewhere"] >= 5
    assert record.reclaimed_at is not None and record.blobs == []


async def rate_places(store, person: str) -> int:
    """The person's places in the hourly rate (bot/agent/budget.py)."""
    prefix = hashlib.sha256(person.encode()).hexdigest()[:24]
    async with store.reading() as conn:
        return (await conn.execute(text(
            "SELECT count(*) FROM submissions WHERE channel = :c AND external_id LIKE :p"),
            {"c": budget.RATE, "p": prefix + ":%"})).scalar()


async def ids_saying(store, word: str) -> set[int]:
    return {e.id for c in await store.list_conversations(limit=100)
            for e in await store.entries_page(c.id, limit=500) if word in e.text}


async def entries_by(store, author: str, exclude=()) -> list:
    out = []
    for c in await store.list_conversations(limit=100):
        if c.key in exclude or c.parent_id is not None:
            continue
        out += [(c.key, e.seq, e.kind, e.text) for e in await store.entries_page(c.id, limit=500)
                if e.author == author]
    return sorted(out)


async def test_without_a_terminal_or_yes_it_refuses_and_changes_nothing(world):
    store, home = world.store, world.home
    before = await every_row(store)
    code, out, err = await steward(home, "forget", "--person", ANNA)
    assert code == 2 and out == ""
    assert err.strip() == ("steward: refusing to forget without a confirmation: there is no "
                           "terminal to ask on. Add --yes to go on (see what goes with "
                           "--dry-run)")
    assert await every_row(store) == before


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # PostgreSQL: workers
async def test_sqlite_refuses_while_a_runner_holds_the_home(world):  # run on (tested below)
    store, home = world.store, world.home
    lock = RunnerLock(home / "runner.lock")
    assert lock.try_acquire()
    try:
        before = await every_row(store)
        code, out, err = await steward(home, "forget", "--person", ANNA, "--yes")
        assert code == 1 and "cannot forget while Steward runs on this home" in err, err
        assert await every_row(store) == before
    finally:
        lock.release()


async def test_a_live_runner_whose_turn_is_forgotten_goes_on(store, tmp_path):
    """A turn of Anna's waits in the model while she is forgotten: the runner drops it at
    its next commit and goes on answering Bob."""
    started, gate = asyncio.Event(), asyncio.Event()

    async def slow(request) -> Response:
        if GONE in request.messages[-1].content:
            started.set()
            await gate.wait()
        return Response(text="ok, noted")

    async with rig_factory(store, tmp_path) as make:
        rig = make(ScriptedModel(slow))
        running = asyncio.create_task(rig.runner.run())
        try:
            await submit_message(store, channel="cli", external_ids=["a1"],
                                 conversation_key=DM_ANNA, text=f"slow {GONE}", author="Anna",
                                 owner=ANNA, scope=private(ANNA))
            rig.runner.wake()
            await asyncio.wait_for(started.wait(), 30)
            args = Namespace(session=None, person=ANNA)
            done, _ = await store_forget.forget(store, target_of(args))
            assert done.unfinished >= 2  # her turn and its model call, mid-way
            gate.set()
            accepted = await submit_message(store, channel="cli", external_ids=["b1"],
                                            conversation_key=DM_BOB, text=f"hi {KEPT}",
                                            author="Bob", owner=BOB, scope=private(BOB))
            rig.runner.wake()
            for _ in range(600):
                if (await store.task_outcome(accepted.turn_id))[0] in TERMINAL:
                    break
                await asyncio.sleep(0.05)
            assert (await store.task_outcome(accepted.turn_id))[0] == "done"
            assert not running.done()
        finally:
            rig.runner.stop()
            await asyncio.wait_for(running, 30)
    assert GONE not in await every_row(store)
    assert [c.key for c in await store.list_conversations()] == [DM_BOB]
    assert (await store.entries_page((await store.get_conversation(DM_BOB)).id))[-1].text == \
        "ok, noted"


async def test_forget_one_session_takes_what_it_wrote_elsewhere(store, store_url, tmp_path):
    """`--session`: one conversation and its fork go; the facts it kept in its scope's
    document go from it; the other conversation of the same scope, and its facts, stay."""
    (tmp_path / "config.toml").write_text(f'[store]\nurl = "{store_url}"\n'
                                          '[llm]\nprovider = "scripted"\n')
    async with rig_factory(store, tmp_path) as make:
        rig = make(ScriptedModel(script), *FACT_TOOLS)
        for key, n, said in (("cli:one", 1, f"remember {GONE} lives in one"),
                             ("cli:two", 2, f"remember {KEPT} lives in two"),
                             ("cli:one", 3, f"todo feed {GONE}")):
            await submit_message(store, channel="cli", external_ids=[f"request:{n}"],
                                 conversation_key=key, text=said, author="you")
            await rig.run()
    await store.fork("cli:one", "cli:one@2")
    await embed_all(store)
    code, out, err = await steward(tmp_path, "forget", "--session", "cli:one", "--dry-run")
    assert code == 0 and "cli:one@2" in out and "cli:two" not in out, (out, err)
    code, out, err = await steward(tmp_path, "forget", "--session", "cli:one", "--yes")
    assert code == 0, err
    assert [c.key for c in await store.list_conversations()] == ["cli:two"]
    assert [f["text"] for f in await read_facts(store, "private:local")] == [
        f"{KEPT} lives in two"]
    rows = await every_row(store)
    assert GONE not in rows and KEPT in rows
    if store.dialect == "sqlite":
        assert not [p for p, data in raw_files(tmp_path).items() if GONE.encode() in data]
    code, out, err = await steward(tmp_path, "forget", "--session", "cli:one", "--yes")
    assert code == 1 and err.strip() == "steward: no conversation 'cli:one'"


def test_the_journal_file_is_the_slack_connectors():
    from connectors.slack.connector import JOURNAL_FILE

    assert SLACK_JOURNAL == JOURNAL_FILE


async def test_a_forget_stopped_after_its_commit_is_finished_by_the_next(store, store_url,
                                                                        tmp_path):
    """The removal committed, then the process died: its record lists the blobs still to
    delete and says the space is not reclaimed; the next `steward forget` (of anyone)
    finishes it."""
    (tmp_path / "config.toml").write_text(f'[store]\nurl = "{store_url}"\n'
                                          '[llm]\nprovider = "scripted"\n')
    blobs = BlobStore.of_home(tmp_path)
    digest = await blobs.put(ANNA_BLOB)
    await submit_message(store, channel="cli", external_ids=["m1"], conversation_key=DM_ANNA,
                         text=f"see {GONE}", author="Anna", owner=ANNA, scope=private(ANNA),
                         data={"attachments": [{"blob": digest, "kind": "binary"}]})
    await store_forget.forget(store, target_of(Namespace(session=None, person=ANNA)))
    [left] = await store_forget.pending(store)
    assert left.blobs == [digest] and left.reclaimed_at is None
    assert blobs.path(digest).exists()
    code, out, err = await steward(tmp_path, "forget", "--person", BOB, "--yes")
    assert code == 0 and "Nothing stored for person" in out, err
    assert await store_forget.pending(store) == []
    assert not blobs.path(digest).exists()
    if store.dialect == "sqlite":
        assert not [p for p, data in raw_files(tmp_path).items() if GONE.encode() in data]
