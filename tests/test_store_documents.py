"""Stored documents: as-of reads across base snapshots, history and fork policies, corrupt
history kept to its own document. Every test runs on SQLite and PostgreSQL."""

import asyncio
import copy
import random

import pytest
from sqlalchemy import text

from store import (
    CorruptRow,
    DocumentCorrupt,
    NotFound,
    StoreError,
    Writes,
    conversation_namespace,
)
from store.documents.draft import Draft
from store.documents.versions import BASE_EVERY
from store.errors import DocumentConflict, DocumentError

# --- helpers ---------------------------------------------------------------------------------


def random_edit(draft: Draft, rng: random.Random) -> None:
    """One to three random mutations of a document shaped like
    {"items": [int], "tags": {str: str}, "n": number, "notes": [{"t": str, "k": int}]}."""
    root = draft.root
    for _ in range(rng.randint(1, 3)):
        root.setdefault("items", [])
        root.setdefault("tags", {})
        root.setdefault("notes", [])
        root.setdefault("n", 0)
        items, tags, notes = root["items"], root["tags"], root["notes"]
        choice = rng.randrange(12)
        if choice == 0:
            items.append(rng.randrange(100))
        elif choice == 1:
            items.insert(rng.randint(0, len(items)), rng.randrange(100))
        elif choice == 2 and items:
            items.pop(rng.randrange(len(items)))
        elif choice == 3 and len(items) > 1:
            start = rng.randrange(len(items))
            items[start:start + rng.randint(0, 2)] = [rng.randrange(100)
                                                       for _ in range(rng.randint(0, 3))]
        elif choice == 4:
            items.sort(reverse=rng.random() < 0.5)
        elif choice == 5:
            tags[f"k{rng.randrange(6)}"] = f"v{rng.randrange(1000)}"
        elif choice == 6 and tags:
            del tags[rng.choice(sorted(tags))]
        elif choice == 7:
            root.increment("n", rng.choice([1, 2, -3, 0.5]))
        elif choice == 8:
            notes.append({"t": f"note{rng.randrange(1000)}", "k": 0})
        elif choice == 9 and notes:
            notes[rng.randrange(len(notes))].increment("k")
        elif choice == 10 and notes:
            notes[rng.randrange(len(notes))]["t"] = f"edited{rng.randrange(1000)}"
        elif choice == 11:
            items.extend([rng.randrange(100), rng.randrange(100)])
        else:
            root["last"] = rng.randrange(1000)


async def edit(store, conv, name: str, ops: list[dict], *, entry: str | None = "step",
               **policies) -> int:
    """Commit an entry (unless `entry` is None) and one edit of document `name`; returns
    the new version."""
    ns = conversation_namespace(conv.id)
    w = Writes()
    if entry is not None:
        w.append(conv.id, "user", entry)
    w.edit_document(ns, name, ops, conversation_id=conv.id, **policies)
    return (await store.commit(w)).document_versions[(ns, name)]


def set_op(key: str, value) -> list[dict]:
    return [{"op": "set", "path": [key], "value": value}]


async def document_id(store, namespace: str, name: str) -> int:
    async with store.engines.read.connect() as conn:
        return (await conn.execute(
            text("select id from documents where namespace = :ns and name = :name"),
            {"ns": namespace, "name": name})).scalar_one()


async def stored_versions(store, doc_id: int) -> list[tuple]:
    async with store.engines.read.connect() as conn:
        rows = (await conn.execute(text(
            "select version, base is not null, ops is not null from document_versions"
            " where document_id = :id order by version"), {"id": doc_id})).all()
    return [tuple(r) for r in rows]


async def overwrite_ops(store, doc_id: int, version: int, raw: str) -> None:
    async with store.engines.write.begin() as conn:
        res = await conn.execute(text(
            "update document_versions set ops = :ops"
            " where document_id = :id and version = :v and ops is not null"),
            {"ops": raw, "id": doc_id, "v": version})
        assert res.rowcount == 1, "expected a delta row to corrupt"


# --- as-of reads -----------------------------------------------------------------------------


async def test_as_of_reads_return_every_recorded_value_across_base_snapshots(store):
    rng = random.Random(20240611)
    conv = await store.ensure_conversation("cli:asof")
    ns = conversation_namespace(conv.id)
    value: dict = {}
    by_seq: list[tuple[int, dict]] = [(0, {})]
    by_version: dict[int, dict] = {0: {}}

    for step in range(80):
        w = Writes()
        w.append(conv.id, "user", f"step {step}")
        edits = step % 7 != 3  # now and then a step that only adds an entry
        if edits:
            draft = Draft(value)
            random_edit(draft, rng)
            assert draft.ops
            w.edit_document(ns, "doc", draft.ops, conversation_id=conv.id)
        result = await store.commit(w)
        [seq] = result.entry_seqs
        if edits:
            value = draft.value
            by_version[result.document_versions[(ns, "doc")]] = value
        by_seq.append((seq, value))

    assert max(by_version) > 2 * BASE_EVERY
    for seq, expected in by_seq:
        assert (await store.read_document(ns, "doc", as_of_seq=seq)).value == expected, seq
    for version, expected in by_version.items():
        read = await store.read_document(ns, "doc", version=version)
        assert (read.version, read.value) == (version, expected)
    latest = await store.read_document(ns, "doc")
    assert (latest.version, latest.value) == (max(by_version), value)
    # Bases were laid down periodically, not only at version 0.
    doc_id = await document_id(store, ns, "doc")
    bases = [v for v, is_base, _ in await stored_versions(store, doc_id) if is_base]
    assert bases == [0, BASE_EVERY, 2 * BASE_EVERY]


async def test_as_of_read_reports_the_version_and_position_that_made_it(store):
    conv = await store.ensure_conversation("cli:meta")
    await edit(store, conv, "doc", set_op("a", 1))             # entry 1, version 1
    await edit(store, conv, "other", set_op("x", 1))           # entry 2
    await edit(store, conv, "doc", set_op("a", 2))             # entry 3, version 2
    read = await store.read_document(conversation_namespace(conv.id), "doc", as_of_seq=2)
    assert (read.version, read.value, read.at_seq, read.conversation_id) == (
        1, {"a": 1}, 1, conv.id)
    read = await store.read_document(conversation_namespace(conv.id), "doc", as_of_seq=0)
    assert (read.version, read.value) == (0, {})


# --- history "latest" ------------------------------------------------------------------------


async def test_history_latest_keeps_and_returns_only_the_newest_value(store):
    conv = await store.ensure_conversation("cli:latest")
    ns = conversation_namespace(conv.id)
    for n in range(1, 41):
        await edit(store, conv, "scratch", [{"op": "set", "path": ["n"], "value": n}],
                   initial={"n": 0}, history="latest")

    for seq in (0, 1, 20, 40):
        read = await store.read_document(ns, "scratch", as_of_seq=seq)
        assert (read.version, read.value) == (40, {"n": 40})
    doc_id = await document_id(store, ns, "scratch")
    assert await stored_versions(store, doc_id) == [(0, True, False), (40, True, False)]
    assert (await store.read_document(ns, "scratch", version=0)).value == {"n": 0}
    with pytest.raises(NotFound):
        await store.read_document(ns, "scratch", version=20)


# --- fork policies ---------------------------------------------------------------------------


POLICIES = ("initial", "current", "as_of")


async def test_fork_copies_each_document_by_its_fork_policy(store):
    parent = await store.ensure_conversation("cli:parent")
    parent_ns = conversation_namespace(parent.id)
    for n in range(1, 9):
        w = Writes()
        w.append(parent.id, "user", f"p{n}")
        for policy in POLICIES:
            w.edit_document(parent_ns, policy, set_op("n", n), initial={"n": 0},
                            fork_policy=policy, conversation_id=parent.id)
        await store.commit(w)

    fork = await store.fork("cli:parent", "cli:fork", at_seq=5)
    fork_ns = conversation_namespace(fork.id)
    assert (await store.read_document(fork_ns, "initial")).value == {"n": 0}
    assert (await store.read_document(fork_ns, "current")).value == {"n": 8}
    assert (await store.read_document(fork_ns, "as_of")).value == {"n": 5}

    # Later edits on either side stay on that side.
    for policy in POLICIES:
        await edit(store, fork, policy, set_op("fork", True), fork_policy=policy)
        await edit(store, parent, policy, set_op("parent", True), fork_policy=policy)
    for policy, copied in (("initial", 0), ("current", 8), ("as_of", 5)):
        assert (await store.read_document(fork_ns, policy)).value == {"n": copied,
                                                                      "fork": True}
        assert (await store.read_document(parent_ns, policy)).value == {"n": 8,
                                                                        "parent": True}


async def fork_of_counter(store, *, at_seq: int):
    """A root whose document "doc" holds {"n": n} after entry n (1..10), and a fork of it."""
    root = await store.ensure_conversation("cli:root")
    for n in range(1, 11):
        await edit(store, root, "doc", set_op("n", n), initial={"n": 0})
    return await store.fork("cli:root", "cli:first", at_seq=at_seq)


async def test_fork_reads_a_document_as_of_an_inherited_position(store):
    """Entry 3 is part of the fork's transcript (inherited from the root), so the fork's
    `as_of` copy read as of entry 3 is the root's value as of entry 3."""
    first = await fork_of_counter(store, at_seq=6)
    first_ns = conversation_namespace(first.id)
    assert (await store.read_document(first_ns, "doc")).value == {"n": 6}
    assert (await store.read_document(first_ns, "doc", as_of_seq=3)).value == {"n": 3}


async def test_fork_of_a_fork_copies_the_value_as_of_an_inherited_position(store):
    """The second fork's point (3) lies in the entries the first fork inherited from the
    root, so its `as_of` copy is the root's value as of entry 3."""
    await fork_of_counter(store, at_seq=6)
    second = await store.fork("cli:first", "cli:second", at_seq=3)
    assert (await store.read_document(conversation_namespace(second.id), "doc")).value == {
        "n": 3}


# --- corrupt history -------------------------------------------------------------------------


@pytest.mark.parametrize("raw, error", [
    ('[{"op":"delete","path":["nope"]}]', DocumentCorrupt),
    ('[{"op":"set", "path": [', CorruptRow),
])
async def test_a_corrupt_delta_breaks_only_its_own_document_from_that_version(
        store, raw, error):
    conv = await store.ensure_conversation("cli:corrupt")
    ns = conversation_namespace(conv.id)
    for n in range(1, 6):
        await edit(store, conv, "broken", set_op(f"k{n}", n))
        await edit(store, conv, "healthy", set_op(f"k{n}", n))
    broken_id = await document_id(store, ns, "broken")
    await overwrite_ops(store, broken_id, 3, raw)

    with pytest.raises(error) as caught:
        await store.read_document(ns, "broken")
    assert isinstance(caught.value, StoreError)
    with pytest.raises(error):
        await store.read_document(ns, "broken", version=3)
    assert (await store.read_document(ns, "broken", version=2)).value == {"k1": 1, "k2": 2}
    assert (await store.read_document(ns, "broken", as_of_seq=3)).value == {"k1": 1, "k2": 2}

    healthy = await store.read_document(ns, "healthy")
    assert healthy.value == {f"k{n}": n for n in range(1, 6)}
    assert await edit(store, conv, "healthy", set_op("more", True)) == 6
    assert (await store.read_document(ns, "healthy")).value["more"] is True

    # Writing the corrupt document fails with the same error and leaves nothing behind.
    seq_before = (await store.get_conversation(conv.key)).last_seq
    with pytest.raises(error):
        await edit(store, conv, "broken", set_op("k6", 6))
    assert (await store.get_conversation(conv.key)).last_seq == seq_before


async def test_a_corrupt_document_does_not_stop_a_fork(store):
    conv = await store.ensure_conversation("cli:fork-corrupt")
    ns = conversation_namespace(conv.id)
    for n in range(1, 4):
        await edit(store, conv, "broken", set_op(f"k{n}", n))
        await edit(store, conv, "healthy", set_op(f"k{n}", n))
    await overwrite_ops(store, await document_id(store, ns, "broken"), 2, "{nope")

    fork = await store.fork(conv.key, "cli:fork-corrupt/2")
    fork_ns = conversation_namespace(fork.id)
    assert (await store.read_document(fork_ns, "healthy")).value == {"k1": 1, "k2": 2, "k3": 3}
    with pytest.raises(NotFound):
        await store.read_document(fork_ns, "broken")


# --- missing documents -----------------------------------------------------------------------


async def test_read_document_of_a_missing_document_raises_not_found(store):
    with pytest.raises(NotFound):
        await store.read_document("conversation:999", "nothing")
    conv = await store.ensure_conversation("cli:nf")
    await edit(store, conv, "doc", set_op("a", 1))
    with pytest.raises(NotFound):
        await store.read_document(conversation_namespace(conv.id), "other")
    with pytest.raises(NotFound):
        await store.read_document(conversation_namespace(conv.id), "doc", version=7)


# --- optimistic concurrency: an edit names the version it was made against ------------------


async def entry_count(store, conv) -> int:
    return len(await store.entries_page(conv.id, limit=100))


async def test_an_edit_made_against_an_old_version_is_refused_with_the_whole_step(store):
    conv = await store.ensure_conversation("cli:cas")
    ns = conversation_namespace(conv.id)
    # A document that does not exist yet is version 0 (its initial value).
    assert await edit(store, conv, "doc", set_op("a", 1), base_version=0) == 1
    assert await edit(store, conv, "doc", set_op("a", 2), base_version=1) == 2
    before = await entry_count(store, conv)
    with pytest.raises(DocumentConflict) as caught:
        await edit(store, conv, "doc", set_op("a", 3), base_version=1)  # made against v1
    assert isinstance(caught.value, DocumentError) and isinstance(caught.value, StoreError)
    assert (caught.value.expected, caught.value.found) == (1, 2)
    assert "moved on" in str(caught.value) and "'doc'" in str(caught.value)
    # Nothing of the refused step landed: not the edit, not its entry.
    read = await store.read_document(ns, "doc")
    assert (read.version, read.value) == (2, {"a": 2})
    assert await entry_count(store, conv) == before
    # A new document refuses an edit that expected it to exist already.
    with pytest.raises(DocumentConflict):
        await edit(store, conv, "fresh", set_op("a", 1), base_version=3)
    with pytest.raises(NotFound):
        await store.read_document(ns, "fresh")
    # Without a base version an edit applies to whatever is current (as before).
    assert await edit(store, conv, "doc", set_op("a", 4)) == 3


async def test_parallel_edits_from_one_base_version_land_exactly_once(store):
    conv = await store.ensure_conversation("cli:cas-race")
    ns = conversation_namespace(conv.id)
    await edit(store, conv, "list", [{"op": "set", "path": ["items"], "value": list("abcd")}])

    base = await store.read_document(ns, "list")  # every edit is made against this one

    async def remove(index: int):
        draft = Draft(copy.deepcopy(base.value))
        del draft.root["items"][index]
        w = Writes()
        w.edit_document(ns, "list", draft.ops, base_version=base.version,
                        conversation_id=conv.id)
        return await store.commit(w)

    outcomes = await asyncio.gather(*(remove(i) for i in range(4)), return_exceptions=True)
    won = [o for o in outcomes if not isinstance(o, BaseException)]
    lost = [o for o in outcomes if isinstance(o, BaseException)]
    assert all(isinstance(o, DocumentConflict) for o in lost), lost
    assert len(won) >= 1 and len(won) + len(lost) == 4
    # Each edit that landed was applied to the very value it was made against.
    read = await store.read_document(ns, "list")
    assert read.version == 1 + len(won)
    assert len(read.value["items"]) == 4 - len(won)
