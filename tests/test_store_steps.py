"""Steps of the common shape are written by fixed statements (store/steps.py): each must
land exactly as the general commit (store/commit.py) lands it, on both backends, and be
fenced by the lease in the same way."""

import uuid

import pytest
from sqlalchemy import select

from store import (
    DONE,
    PENDING,
    WAITING,
    Claim,
    LeaseLost,
    TaskUpdate,
    UsageRecord,
    Writes,
    open_store,
)
from store import commit as _commit
from store import steps as _steps
from store.schema import conversations, entries, submissions, tasks, usage
from tests.conftest import PG_URL, _pg_admin


def _spawned_and_said(conv_id: int, parent: str, owner: str) -> Writes:
    """A turn's phase: a reply (with a head marker in the middle), a child, usage, the
    parent waiting."""
    w = Writes()
    w.append(conv_id, "assistant", "thinking ", data={"answers_upto": 1}, task_id=parent)
    w.append(conv_id, "compaction", "summary\x00with a NUL", head=True)
    w.append(conv_id, "tool_result", "é ok", data={"tool_call_id": "c1"}, author="tool")
    w.spawn("child", {"big": "x" * 5000}, parent_id=parent, conversation_id=conv_id,
            idem_key="k1")
    w.record_usage(UsageRecord(provider="p", model="m", input_tokens=3, output_tokens=4,
                               cost_usd=0.5, ok=False, error="boom"))
    w.task_update = TaskUpdate(parent, owner, WAITING, "after", checkpoint={"n": 1},
                               wait_mode="all")
    return w


def _message(conv_id: int, external_ids: list[str]) -> Writes:
    """An inbound message: its submission (an id a channel may send twice), the message and
    its turn; and a quarantined event beside it."""
    w = Writes()
    w.append(conv_id, "user", "hi")
    turn = w.spawn("turn", {"x": 1}, conversation_id=conv_id)
    w.submit("slack", *external_ids, conversation_id=conv_id, payload={"ts": "1.2"},
             task_id=turn)
    w.quarantine("slack", "bad", "malformed", payload={"raw": "\x00?"})
    return w


async def _commit_either(store, step: Writes, general: bool):
    assert _steps.fits(step)
    if general:
        try:
            return await store._write(lambda conn: _commit.apply(conn, store.dialect, step))
        except _commit.DuplicateSubmission:
            return None
    result = await store.commit(step)
    return None if result.duplicate else result


async def _land(store, general: bool) -> dict:
    conv = await store.ensure_conversation("k")
    assert await _commit_either(store, _message(conv.id, ["e1", "e2"]), general)
    # The same event again, with one id new: nothing of it lands.
    assert await _commit_either(store, _message(conv.id, ["e3", "e2"]), general) is None
    [root] = [t.id for t in await store.list_tasks(kind="turn")]
    claim = Claim("w", 1, 60.0)
    [task] = await store.claim(claim)
    result = await _commit_either(store, _spawned_and_said(conv.id, task.id, "w"), general)
    # A delivery, then the same delivery again (a phase run twice): the second finds the
    # first, beside a plain spawn made in between.
    [child] = await store.claim(claim)
    delivered = []
    for n in range(2):
        w = Writes()
        w.deliver("deliver", {"text": "hi"}, key="k.answer", parent_id=child.id,
                  conversation_id=conv.id)
        w.spawn("note", {"n": n}, conversation_id=conv.id)
        w.task_update = TaskUpdate(child.id, "w", WAITING, f"sent{n}", wait_mode="all")
        got = await _commit_either(store, w, general)
        delivered.append(got.task_ids[0])
        assert got.task_ids[1] == w.tasks[1].id
        if n == 0:
            assert got.task_ids[0] == w.tasks[0].id
            [_] = await store.claim(claim)  # the delivery, which the next step finds
            [again] = await store.claim(Claim("w", 1, 60.0))  # the first note
            assert again.kind == "note"
            # The child is running again (as after a crash) and spawns the same delivery.
            await store._write(lambda conn, c=child.id: conn.execute(
                tasks.update().where(tasks.c.id == c).values(state="running",
                                                              lease_owner="w")))
    assert delivered[0] == delivered[1]
    async with store.engines.read.connect() as conn:
        said = (await conn.execute(select(entries.c.seq, entries.c.kind, entries.c.author,
                                          entries.c.text, entries.c.data, entries.c.ref,
                                          entries.c.task_id == root)
                                   .order_by(entries.c.seq))).all()
        conv_row = (await conn.execute(select(conversations.c.last_seq,
                                              conversations.c.head_seq))).one()
        made = (await conn.execute(select(
            tasks.c.kind, tasks.c.parent_id == root, tasks.c.state, tasks.c.phase,
            tasks.c.inputs, tasks.c.checkpoint, tasks.c.idem_key, tasks.c.dedupe_key,
            tasks.c.wait_mode, tasks.c.attempts, tasks.c.crashes, tasks.c.lease_owner)
            .order_by(tasks.c.kind, tasks.c.inputs))).all()
        taken = (await conn.execute(select(
            submissions.c.channel, submissions.c.external_id, submissions.c.task_id == root,
            submissions.c.state, submissions.c.reason, submissions.c.payload)
            .order_by(submissions.c.external_id))).all()
        spent = (await conn.execute(select(
            usage.c.task_id == root, usage.c.provider, usage.c.model, usage.c.input_tokens,
            usage.c.output_tokens, usage.c.cache_read_tokens, usage.c.cost_usd, usage.c.ok,
            usage.c.error))).all()
    return {"seqs": result.entry_seqs, "spawned": len(result.task_ids),
            "delivered": [t == delivered[0] for t in delivered],
            "entries": [tuple(r) for r in said],
            "conversation": tuple(conv_row), "tasks": [tuple(r) for r in made],
            "usage": [tuple(r) for r in spent], "submissions": [tuple(r) for r in taken]}


async def test_a_common_step_lands_as_the_general_commit_lands_it(store_url):
    landed = []
    for general in (True, False):
        store = await open_store(store_url)
        try:
            landed.append(await _land(store, general))
            async with store.engines.write.begin() as conn:  # the next run starts empty
                for table in (usage, submissions, entries, tasks, conversations):
                    await conn.execute(table.delete())
        finally:
            await store.close()
    general, fixed = landed
    assert fixed == general
    assert fixed["seqs"] == [2, 3, 4] and fixed["conversation"] == (4, 3)
    assert [(t[0], t[2]) for t in fixed["tasks"]] == [
        ("child", WAITING), ("deliver", "running"), ("note", "running"), ("note", PENDING),
        ("turn", WAITING)]
    assert [s[1] for s in fixed["submissions"]] == ["bad", "e1", "e2"]


async def test_a_common_step_is_fenced_by_the_lease_and_lands_nothing_without_it(store):
    conv = await store.ensure_conversation("k")
    first = Writes()
    first.spawn("turn", {}, conversation_id=conv.id)
    await store.commit(first)
    [task] = await store.claim(Claim("w", 1, 60.0))
    with pytest.raises(LeaseLost):
        await store.commit(_spawned_and_said(conv.id, task.id, "someone else"))
    assert (await store.get_conversation("k")).last_seq == 0
    assert [t.kind for t in await store.list_tasks()] == ["turn"]
    # The holder's own step lands, and the last child's result wakes the waiting parent.
    await store.commit(_spawned_and_said(conv.id, task.id, "w"))
    [child] = await store.claim(Claim("w", 1, 60.0))
    done = Writes()
    done.append(conv.id, "tool_result", "done", task_id=child.id)
    done.task_update = TaskUpdate(child.id, "w", DONE, "", result={"ok": True})
    await store.commit(done)
    assert (await store.get_task(task.id)).state == PENDING


async def test_a_step_for_a_missing_conversation_fails_clearly_and_lands_nothing(store):
    conv = await store.ensure_conversation("k")
    w = Writes()
    w.append(conv.id, "user", "kept apart")
    w.append(conv.id + 1000, "user", "nowhere")
    w.spawn("turn", {}, conversation_id=conv.id)
    with pytest.raises(LookupError, match=f"no conversation id {conv.id + 1000}"):
        await store.commit(w)
    assert (await store.get_conversation("k")).last_seq == 0
    assert await store.list_tasks() == []


async def test_a_step_claims_what_it_spawned_in_the_same_commit(store):
    """A turn's phase spawns its model call and waits; the claim riding on that commit
    leases the new child at once (on PostgreSQL inside the same call of steward_step)."""
    conv = await store.ensure_conversation("k")
    first = Writes()
    first.spawn("turn", {}, conversation_id=conv.id)
    await store.commit(first)
    [turn] = await store.claim(Claim("w", 1, 60.0))
    step = _spawned_and_said(conv.id, turn.id, "w")
    result = await store.commit(step, then_claim=Claim("w", 4, 60.0))
    [child] = result.claimed
    assert (child.kind, child.parent_id, child.lease_owner) == ("child", turn.id, "w")
    assert result.entry_seqs == [1, 2, 3]
    assert (await store.get_task(child.id)).lease_owner == "w"
    assert (await store.get_task(turn.id)).state == WAITING
    # The child's result frees its slot and wakes the turn, which the next claim takes.
    done = Writes()
    done.append(conv.id, "tool_result", "done", task_id=child.id)
    done.task_update = TaskUpdate(child.id, "w", DONE, "", result={"ok": True})
    [woken] = (await store.commit(done, then_claim=Claim("w", 4, 60.0))).claimed
    assert (woken.id, woken.state, woken.phase) == (turn.id, "running", "after")
    # A step whose lease is gone claims nothing either.
    lost = Writes()
    lost.task_update = TaskUpdate(child.id, "w", DONE, "")
    lost.append(conv.id, "assistant", "late")
    with pytest.raises(LeaseLost):
        await store.commit(lost, then_claim=Claim("w", 4, 60.0))
    assert (await store.get_task(turn.id)).lease_owner == "w"


async def test_the_step_function_goes_with_its_migration():
    """PostgreSQL's steps are one call of a function of migration 0015; taking the store
    back to 0014 drops it, and migrating again brings it back."""
    from alembic import command
    from alembic.config import Config

    from store.engine import MIGRATIONS, create_engines, migrate

    schema = f"t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE SCHEMA "{schema}"')
    engines = create_engines(f"{PG_URL}?schema={schema}")
    try:
        await migrate(engines)

        def functions(sync_conn) -> int:
            return sync_conn.exec_driver_sql(
                "SELECT count(*) FROM pg_proc WHERE proname = 'steward_step' "
                "AND pronamespace = current_schema()::regnamespace").scalar()

        def downgrade(sync_conn) -> None:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = sync_conn
            command.downgrade(cfg, "0014")

        async with engines.write.begin() as conn:
            assert await conn.run_sync(functions) == 1
            await conn.run_sync(downgrade)
            assert await conn.run_sync(functions) == 0
        await migrate(engines)
        async with engines.write.begin() as conn:
            assert await conn.run_sync(functions) == 1
    finally:
        await engines.dispose()
        await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


async def test_a_sleeper_waiting_for_another_task_is_due_at_once_only_if_it_settled(store):
    """A turn sleeping until the older turn of its conversation settles: its step is of
    the common shape too, and it is due at once when that turn has ended already."""
    conv = await store.ensure_conversation("k")
    first = Writes()
    older, newer = (first.spawn("turn", {"n": n}, conversation_id=conv.id) for n in (1, 2))
    await store.commit(first)
    claimed = {t.id: t for t in await store.claim(Claim("w", 2, 60.0))}
    assert set(claimed) == {older, newer}
    later = 10 ** 10

    def sleep() -> Writes:
        w = Writes()
        w.task_update = TaskUpdate(newer, "w", PENDING, "", run_after=later,
                                   wake_if_settled=[older])
        assert _steps.fits(w)
        return w

    await store.commit(sleep())
    assert (await store.get_task(newer)).run_after == later  # the older one still runs
    done = Writes()
    done.task_update = TaskUpdate(older, "w", DONE, "", result={})
    await store.commit(done)
    # It runs again (woken, or its wait checked) and finds the older one over.
    await store._write(lambda conn: conn.execute(tasks.update().where(
        tasks.c.id == newer).values(state="running", lease_owner="w")))
    await store.commit(sleep())
    assert (await store.get_task(newer)).run_after == 0.0  # settled already: due now
