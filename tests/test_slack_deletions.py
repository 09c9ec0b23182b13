"""A question deleted before its turn started is withdrawn: the turn ends without running
(never claimed, not resumed after a restart), nothing is posted, the transcript records
the deletion and the model never sees the question; the turn queued behind it runs at
once. A turn already working keeps today's behaviour (it runs, its answer is not shown)."""

import asyncio
import time

from bot.agent.context import build_request
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Request, Response
from store import DONE, PENDING, RUNNING, WAITING, TaskUpdate, Writes
from tests.fakes.slack_events import deleted, edited, mentions, says, tombstoned
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import TEAM

DM = "D0ALICE"
CHAN = "C0GENERAL"
ALICE, BOB = "U0ALICE", "U0BOB"
KEY = f"slack:{TEAM}:{DM}"
SECRET = "my password is hunter2"
WITHDRAWN = {"withdrawn": True, "reason": "the message was deleted"}


SLACK_PEOPLE = ((ALICE, "Alice"), (BOB, "Bob"))  # the `slack` fixture's workspace


def echo(request: Request) -> Response:
    """Echoes the user's messages since the model's last answer."""
    said = []
    for m in reversed(request.messages):
        if m.role == "assistant":
            break
        if m.role == "user":
            said.insert(0, m.content)
    return Response(text="echo: " + " | ".join(said))


def gated_echo(gate: asyncio.Event) -> ScriptedModel:
    async def answer(request):
        await gate.wait()
        return echo(request)
    return ScriptedModel(answer)


async def until(check, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def lanes_idle(rig: SlackRig) -> None:
    async def idle():
        return rig.connector.inbox.lanes.busy == 0
    await until(idle)


async def turn_of(store, message: dict, channel: str = DM):
    state = await store.submission_state("slack", f"{channel}:{message['ts']}")
    return await store.get_task(state["task_id"])


def seen_by_model(model: ScriptedModel) -> str:
    return "\n".join(m.content for r in model.requests for m in r.messages)


async def test_a_deleted_follow_up_is_withdrawn_and_the_next_one_runs_at_once(
        store, tmp_path, slack):
    gate = asyncio.Event()
    model = gated_echo(gate)
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        _, body = says(slack, DM, ALICE, "first question")
        await rig.send(body)

        async def asked():
            return len(model.requests) == 1
        await until(asked)  # the first turn is in its LLM call
        second, body = says(slack, DM, ALICE, SECRET)
        await rig.send(body)

        async def queued():  # claimed once, found the older turn working, went to sleep
            state = await store.submission_state("slack", f"{DM}:{second['ts']}")
            if state is None:
                return False
            turn = await store.get_task(state["task_id"])
            return turn.state == PENDING and turn.run_after > time.time() + 5
        await until(queued)
        await rig.send(deleted(slack, DM, second["ts"]))
        await lanes_idle(rig)
        withdrawn = await turn_of(store, second)
        assert (withdrawn.state, withdrawn.result) == (DONE, WITHDRAWN)

        _, body = says(slack, DM, ALICE, "third question")
        await rig.send(body)
        await lanes_idle(rig)
        started = time.monotonic()
        gate.set()
        await rig.settle()
        assert time.monotonic() - started < 10  # not the older-turn wait (60 s)

    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: first question",
                                                         "echo: third question"]
    assert "hunter2" not in seen_by_model(model)
    assert await store.list_tasks(parent_id=withdrawn.id) == []  # no LLM call, no delivery
    conv = await store.get_conversation(KEY)
    log = await store.entries_page(conv.id, limit=100)
    [question] = [e for e in log if e.text == SECRET]
    [note] = [e for e in log if e.kind == "system"]
    assert note.text.startswith("(deleted this message before it was answered")
    assert note.data["withdraws"] == [question.seq]
    # what the model would get now (`steward context`) leaves the question out too
    now = await build_request(store, rig.config, conv.id, tools=[], model="m")
    assert "hunter2" not in " ".join(m.content for m in now.request.messages)


async def test_a_question_deleted_before_any_worker_took_it_never_runs(store, tmp_path, slack):
    model = ScriptedModel(echo)
    async with SlackRig(store, tmp_path, slack, client=model, run_tasks=False) as rig:
        asked, body = says(slack, DM, ALICE, SECRET)
        await rig.send(body)
        await lanes_idle(rig)
        assert (await turn_of(store, asked)).state == PENDING
        gone = deleted(slack, DM, asked["ts"])
        await rig.send(gone)
        await lanes_idle(rig)
        # a restart: everything unfinished is resumed, and the withdrawn turn is finished
        await store.recover_tasks(steal_all=True, registered_kinds=["turn"])
        rig.start_runner()
        await rig.settle()
        await rig.send({**gone, "event_id": "EvREPLAYED"})  # the deletion again: a no-op
        _, body = says(slack, DM, ALICE, "hello")
        await rig.send(body)
        await rig.settle()

    turn = await turn_of(store, asked)
    assert (turn.state, turn.result, turn.attempts) == (DONE, WITHDRAWN, 0)
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: hello"]
    assert len(model.requests) == 1 and "hunter2" not in seen_by_model(model)
    conv = await store.get_conversation(KEY)
    kinds = [(e.kind, e.text) for e in await store.entries_page(conv.id, limit=100)]
    assert kinds[:2] == [("user", SECRET), ("system", "(deleted this message before it was "
                                            "answered; it was not answered)")]
    assert len(kinds) == 4  # then "hello" and its answer: the replay added nothing


async def test_deleting_a_question_being_answered_withdraws_only_its_queued_edit(
        store, tmp_path, slack):
    gate = asyncio.Event()
    model = gated_echo(gate)
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        asked, body = says(slack, DM, ALICE, "book a table for 2")
        await rig.send(body)

        async def working():
            return len(model.requests) == 1
        await until(working)
        await rig.send(edited(slack, DM, asked["ts"], "book a table for 4"))
        await lanes_idle(rig)
        await rig.send(deleted(slack, DM, asked["ts"]))
        await lanes_idle(rig)
        gate.set()
        await rig.settle()

    assert slack.bot_messages(DM) == []
    assert len(model.requests) == 1  # the edit's turn never asked the model
    turns = await store.list_tasks(kind="turn")
    assert [t.result.get("withdrawn", False) for t in turns] == [False, True]
    [delivery] = await store.list_tasks(kind="deliver")
    assert delivery.result.get("skipped") == "the question was deleted"
    conv = await store.get_conversation(KEY)
    log = await store.entries_page(conv.id, limit=100)
    [edit] = [e for e in log if e.text == "(edited) book a table for 4"]
    [note] = [e for e in log if e.text.startswith("(deleted an earlier message")]
    assert note.kind == "user" and note.data["withdraws"] == [edit.seq]


async def test_a_deleted_thread_parent_tombstone_withdraws_its_turn(store, tmp_path, slack):
    model = ScriptedModel(echo)
    async with SlackRig(store, tmp_path, slack, client=model, run_tasks=False,
                        allowed_users=[ALICE, BOB]) as rig:
        top, body = says(slack, CHAN, ALICE, mentions("is the secret plan ready?"))
        await rig.send(body)
        await lanes_idle(rig)
        _, body = says(slack, CHAN, BOB, "I would like to know too", thread_ts=top["ts"])
        await rig.send(body)
        await lanes_idle(rig)
        await rig.send(tombstoned(slack, CHAN, top["ts"]))
        await lanes_idle(rig)
        rig.start_runner()
        await rig.settle()

    assert (await turn_of(store, top, CHAN)).result == WITHDRAWN
    assert [(m["text"], m["thread_ts"]) for m in slack.bot_messages(CHAN)] == [
        ("echo: I would like to know too", top["ts"])]
    assert "secret plan" not in seen_by_model(model)


async def test_withdrawing_is_a_compare_and_set_on_a_task_not_yet_started(store):
    conv = await store.ensure_conversation("k")
    w = Writes()
    first = w.spawn("turn", {}, conversation_id=conv.id)
    second = w.spawn("turn", {}, conversation_id=conv.id)
    await store.commit(w)
    [claimed] = await store.claim_tasks("worker", 1, 30)
    assert claimed.id == first

    def withdrawing(task_id, **kw) -> Writes:
        w = Writes()
        w.withdraw(task_id, {"withdrawn": True}, **kw)
        w.append(conv.id, "system", "deleted")
        return w

    # started (claimed): the whole step is dropped, its note with it
    assert (await store.commit(withdrawing(first))).duplicate
    # not started, but an older turn it depends on has: dropped too
    assert (await store.commit(withdrawing(second, unstarted=[first]))).duplicate
    assert (await store.get_conversation("k")).last_seq == 0
    assert (await store.get_task(first)).state == RUNNING
    # not started: done, never claimed
    assert not (await store.commit(withdrawing(second))).duplicate
    task = await store.get_task(second)
    assert (task.state, task.result) == (DONE, {"withdrawn": True})
    assert (await store.get_conversation("k")).last_seq == 1
    assert await store.claim_tasks("worker", 5, 30) == []
    assert (await store.commit(withdrawing(second))).duplicate  # once only

    # a parent waiting for a withdrawn child is woken like for any child that settled
    w = Writes()
    parent = w.spawn("flow", {})
    await store.commit(w)
    await store.claim_tasks("worker", 5, 30)
    w = Writes()
    child = w.spawn("turn", {}, parent_id=parent)
    w.update_task(TaskUpdate(parent, "worker", WAITING, "after", wait_mode="all"))
    await store.commit(w)
    assert not (await store.commit(withdrawing(child))).duplicate
    assert (await store.get_task(parent)).state == PENDING
