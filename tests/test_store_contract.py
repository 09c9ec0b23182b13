"""The store's contract, the same cases on every backend (the `store` fixture runs each
on SQLite and on PostgreSQL): a step's writes land whole or not at all, claims lease and
fence, idempotent keys hold, and what was written reads back the same. A new backend
(store/backend.py) is done when these pass on it."""

import ast
import itertools
from pathlib import Path

import pytest
from sqlalchemy import select

from store import (
    DONE,
    PENDING,
    RUNNING,
    WAITING,
    Claim,
    LeaseLost,
    ScheduleWrite,
    TaskUpdate,
    UsageRecord,
    Writes,
)
from store import commit as _commit
from store import postgres as _postgres
from store import sqlite as _sqlite
from store import steps as _steps
from store import writes as _writes
from store.schema import conversations, entries, submissions, tasks, usage


async def _turn(store, key="contract:1"):
    conv = await store.ensure_conversation(key, owner="anna")
    w = Writes()
    turn = w.spawn("turn", {"q": 1}, conversation_id=conv.id)
    await store.commit(w)
    return conv, turn


async def test_a_steps_writes_land_together_and_read_back(store):
    conv, turn = await _turn(store)
    [claimed] = await store.claim(Claim("w", 1, 60.0))
    assert claimed.id == turn and claimed.state == RUNNING
    w = Writes()
    w.submit("slack", "T1:1", conversation_id=conv.id, payload={"text": "hi"})
    w.append(conv.id, "user", "hi", author="anna", ref="m1", task_id=turn)
    w.append(conv.id, "assistant", "hello", data={"n": 1})
    child = w.spawn("tool", {"name": "x"}, parent_id=turn, conversation_id=conv.id,
                    idem_key="k")
    w.record_usage(UsageRecord(provider="p", model="m", input_tokens=3, output_tokens=4,
                               cost_usd=0.25, conversation_id=conv.id))
    w.task_update = TaskUpdate(turn, "w", WAITING, "after", checkpoint={"n": 1})
    result = await store.commit(w)
    assert not result.duplicate
    assert result.entry_seqs == [1, 2] and result.task_ids == [child]

    page = await store.entries_page(conv.id)
    assert [(e.seq, e.kind, e.text, e.author, e.data) for e in page] == [
        (1, "user", "hi", "anna", None), (2, "assistant", "hello", None, {"n": 1})]
    assert (await store.entry_of_task(conv.id, turn)).text == "hi"
    assert (await store.get_conversation_by_id(conv.id)).last_seq == 2
    parent = await store.get_task(turn)
    assert (parent.state, parent.phase, parent.checkpoint) == (WAITING, "after", {"n": 1})
    assert [t.id for t in await store.list_tasks(parent_id=turn)] == [child]
    assert await store.known_submissions("slack", ["T1:1", "T1:2"]) == {"T1:1"}
    assert (await store.usage_totals())["calls"] == 1


async def test_a_child_settling_wakes_its_waiting_parent(store):
    conv, turn = await _turn(store)
    await store.claim(Claim("w", 1, 60.0))
    w = Writes()
    child = w.spawn("tool", {}, parent_id=turn, conversation_id=conv.id)
    w.task_update = TaskUpdate(turn, "w", WAITING, "after", wait_mode="all")
    await store.commit(w)
    [claimed] = await store.claim(Claim("v", 1, 60.0))
    assert claimed.id == child
    done = Writes()
    done.task_update = TaskUpdate(child, "v", DONE, "", result={"ok": True})
    await store.commit(done)
    assert (await store.get_task(turn)).state == PENDING
    assert await store.task_outcome(child) == (DONE, {"ok": True}, None)


async def test_a_claim_leases_each_task_once_and_fences_its_updates(store):
    conv, turn = await _turn(store)
    assert [t.id for t in await store.claim(Claim("a", 4, 60.0))] == [turn]
    assert await store.claim(Claim("b", 4, 60.0)) == []  # leased: not again
    stolen = Writes()
    stolen.task_update = TaskUpdate(turn, "b", DONE, "")
    with pytest.raises(LeaseLost):
        await store.commit(stolen)
    assert (await store.get_task(turn)).lease_owner == "a"
    mine = Writes()
    mine.append(conv.id, "assistant", "done")
    mine.task_update = TaskUpdate(turn, "a", DONE, "", result=1)
    await store.commit(mine)
    assert (await store.get_task(turn)).state == DONE


async def test_an_expired_lease_is_taken_over_and_counted_a_death(store):
    _, turn = await _turn(store)
    await store.claim(Claim("dead", 1, -1.0))  # expired at once
    [taken] = await store.claim(Claim("alive", 1, 60.0))
    assert (taken.id, taken.lease_owner, taken.crashes) == (turn, "alive", 1)


async def test_a_result_claims_the_next_task_in_the_same_commit(store):
    conv, turn = await _turn(store)
    await store.claim(Claim("w", 1, 60.0))
    w = Writes()
    nxt = w.spawn("turn", {}, conversation_id=conv.id)
    w.task_update = TaskUpdate(turn, "w", DONE, "")
    result = await store.commit(w, then_claim=Claim("w", 1, 60.0))
    assert [t.id for t in result.claimed] == [nxt]


async def test_a_submission_seen_before_undoes_the_whole_step(store):
    conv = await store.ensure_conversation("contract:dup")
    first = Writes()
    first.submit("email", "<a@x>", conversation_id=conv.id)
    first.append(conv.id, "user", "once")
    assert not (await store.commit(first)).duplicate
    again = Writes()
    again.submit("email", "<a@x>", conversation_id=conv.id)
    again.append(conv.id, "user", "twice")
    again.spawn("turn", {}, conversation_id=conv.id)
    assert (await store.commit(again)).duplicate
    assert [e.text for e in await store.entries_page(conv.id)] == ["once"]
    assert await store.list_tasks() == []


async def test_a_dedupe_key_makes_one_task_however_often_it_is_spawned(store):
    conv = await store.ensure_conversation("contract:dedupe")
    ids = []
    for _ in range(2):
        w = Writes()
        w.spawn("deliver", {"n": len(ids)}, conversation_id=conv.id, dedupe_key="send:1")
        ids.append((await store.commit(w)).task_ids[0])
    assert ids[0] == ids[1]
    [task] = await store.list_tasks(kind="deliver")
    assert task.inputs == {"n": 0}


async def test_a_conversation_is_made_once_per_key(store):
    a = await store.ensure_conversation("contract:once", owner="anna")
    b = await store.ensure_conversation("contract:once", owner="someone else")
    assert a.id == b.id and b.owner == "anna"


def test_the_facade_never_asks_which_database_it_is_on():
    """store/store.py holds no branch on the dialect: what differs is a backend's."""
    tree = ast.parse((Path(__file__).parents[1] / "store" / "store.py").read_text())
    named = [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
             and node.value in ("sqlite", "postgresql")]
    assert named == []


# -- the general commit and the common step write the same rows ----------------------------

_CLOCK = 1_800_000_000.0


def _first_step(conv_id: int, general: bool) -> Writes:
    """An inbound message; with a document and a schedule beside it when `general`."""
    w = Writes()
    w.submit("slack", "T1:1", "T1:2", conversation_id=conv_id, payload={"ts": "1.2"})
    w.quarantine("slack", "bad", "malformed", payload={"raw": "\x00?"})
    w.append(conv_id, "user", "hi", author="anna", ref="m1")
    w.append(conv_id, "compaction", "summary", head=True, data={"upto": 1})
    w.spawn("turn", {"q": 1}, conversation_id=conv_id)
    w.record_usage(UsageRecord(provider="p", model="m", input_tokens=3, output_tokens=4,
                               cache_read_tokens=5, cost_usd=0.25, conversation_id=conv_id))
    if general:
        w.edit_document("notes", "todo", [{"op": "set", "path": ["a"], "value": 1}],
                        conversation_id=conv_id)
        w.save_schedule(ScheduleWrite("s1", "plants", "water them",
                                      {"kind": "cron", "expr": "0 9 * * *"}, "UTC",
                                      {"channel": "cli"}, _CLOCK + 3600, conv_id))
    return w


def _turn_step(conv_id: int, turn: str, general: bool) -> Writes:
    """A turn's phase: its reply, a tool call, a delivery, usage, the turn waiting."""
    w = Writes()
    w.append(conv_id, "assistant", "thinking é", task_id=turn, data={"n": 1})
    w.spawn("tool", {"name": "x"}, parent_id=turn, conversation_id=conv_id, idem_key="k",
            run_after=_CLOCK + 5)
    w.deliver("deliver", {"text": "hi"}, key="k.answer", parent_id=turn,
              conversation_id=conv_id)
    w.record_usage(UsageRecord(provider="p", model="m", input_tokens=1, output_tokens=2,
                               ok=False, error="boom"))
    w.task_update = TaskUpdate(turn, "w", WAITING, "after", checkpoint={"n": 1})
    if general:
        w.edit_document("notes", "todo", [{"op": "set", "path": ["b"], "value": 2}])
    return w


async def _rows(store, conv_id: int) -> dict:
    """Every row of the four tables a step inserts into, its surrogate key left out and
    its conversation named, not numbered (the two runs' conversations are different)."""
    out = {}
    async with store.engines.read.connect() as conn:
        for table in (submissions, entries, tasks, usage):
            rows = (await conn.execute(select(table))).mappings().all()
            out[table.name] = sorted((
                tuple(sorted((k, "conv" if k == "conversation_id" and v == conv_id else v)
                             for k, v in r.items() if not (k == "id" and table is not tasks)))
                for r in rows), key=repr)
    return out


async def test_the_general_commit_writes_the_rows_a_common_step_writes(store, monkeypatch):
    """A step with a document or a schedule goes through `store/commit.py`, one without
    through the fast path (SQLite's plan, PostgreSQL's `steward_step`): for the same
    inputs, at the same clock, both write the same rows, column for column."""
    for module in (_commit, _sqlite, _postgres):
        monkeypatch.setattr(module, "now", lambda: _CLOCK)
    landed = []
    for general in (False, True):
        ids = itertools.count()
        monkeypatch.setattr(_writes, "new_id", lambda ids=ids: f"id{next(ids):02}")
        conv = await store.ensure_conversation("contract:same")
        first = _first_step(conv.id, general)
        assert _steps.fits(first) is not general
        assert (await store.commit(first)).entry_seqs == [1, 2]
        [turn] = await store.claim(Claim("w", 1, 60.0))
        second = _turn_step(conv.id, turn.id, general)
        assert _steps.fits(second) is not general
        result = await store.commit(second)
        assert result.entry_seqs == [3] and len(result.task_ids) == 2
        landed.append(await _rows(store, conv.id))
        if general:
            break
        async with store.engines.write.begin() as conn:  # the next run starts empty
            for table in (usage, submissions, entries, tasks, conversations):
                await conn.execute(table.delete())
    fast, general = landed
    assert [len(fast[t]) for t in ("submissions", "entries", "tasks", "usage")] == [3, 3, 3, 2]
    assert general == fast
