"""A home restored from a backup joins a Slack thread its predecessor spoke in after the
snapshot: what it takes in as the thread's history must show what was already answered,
or the next message makes the model answer an old one again (the restore test's race:
Slack keeps the thread in time order, so the predecessor's answer to a reply can come
after the next reply, and a history cut at that reply showed the first one unanswered).

In process (tests/fakes/slack_rig.py) against the fake Slack, the home marked restored the
way bot/app/wiring.py marks it (`reconcile_until`)."""

from __future__ import annotations

import asyncio
import json

from bot.agent.inbox import answer_key
from connectors.slack.messages import META_TYPE
from store import open_store
from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import BOT_ID, BOT_USER, TEAM

ALICE, DM = "U0ALICE", "D0ALICE"


def answered(slack, channel: str, thread_ts: str | None, text: str, *asked: dict) -> dict:
    """The predecessor's answer to `asked[0]` (taking in the rest too), as it posted it."""
    payload = {"key": answer_key("slack", f"{channel}:{asked[0]['ts']}") + ".answer"}
    if len(asked) > 1:
        payload["answers"] = [m["ts"] for m in asked[1:]]
    return slack.add_message(channel, {
        "user": BOT_USER, "bot_id": BOT_ID, "text": text, "team": TEAM,
        **({"thread_ts": thread_ts} if thread_ts else {}),
        "metadata": {"event_type": META_TYPE, "event_payload": payload}})


def transcript(request) -> list[tuple[str, str]]:
    out = []
    for m in request.messages:
        content = m.content if isinstance(m.content, str) else json.dumps(m.content)
        if m.role in ("user", "assistant") and content:
            out.append((m.role, content))
    return out


async def test_a_restored_home_takes_a_thread_in_with_its_answers(store, tmp_path, slack):
    # The predecessor's life after the snapshot: Alice opened a thread under her DM
    # message, replied twice; the answer to the first reply came after the second.
    top, _ = says(slack, DM, ALICE, "tok-top what time is it?")
    answered(slack, DM, None, "re tok-top", top)
    first, _ = says(slack, DM, ALICE, "tok-first look at the clock", thread_ts=top["ts"])
    second, second_event = says(slack, DM, ALICE, "tok-second what day is it",
                                thread_ts=top["ts"])
    answered(slack, DM, top["ts"], "re tok-first", first)
    answered(slack, DM, top["ts"], "re tok-second", second)

    async with SlackRig(store, tmp_path, slack, restored=True) as rig:
        # Slack retries the second reply's event to the restored home: answered before.
        assert (await rig.send(second_event, retry_num=1))[0] == 200
        await rig.settle()
        _, third_event = says(slack, DM, ALICE, "tok-third and now?", thread_ts=top["ts"])
        assert (await rig.send(third_event))[0] == 200
        await rig.settle()

    replies = [m["text"] for m in slack.bot_messages(DM, top["ts"])]
    assert replies == ["re tok-first", "re tok-second", "echo: tok-third and now?"]
    [request] = [r for r in rig.client.requests if "tok-third" in json.dumps(
        [m.content for m in r.messages], default=str)]
    said = transcript(request)
    # Every earlier message of the thread is followed by its answer before the new one.
    where = {text.split()[0]: i for i, (_, text) in enumerate(said)}
    for token, answer in (("tok-first", "re"), ("tok-second", "re")):
        assert token in where, said
        follows = said[where[token] + 1:]
        assert any(role == "assistant" and text == f"{answer} {token}"
                   for role, text in follows[:3]), said
    assert said[-1] == ("user", "tok-third and now?") or said[-1][1].endswith(
        "tok-third and now?"), said


async def test_history_never_stands_between_a_waiting_message_and_its_turn(
        store, tmp_path, slack):
    # Before the snapshot's successor started: Alice asked something in her DM and the
    # predecessor answered it; after the restore she asks again, and Slack's retry of the
    # first (or the catch-up) reaches the restored home while the new one waits.
    old, old_event = says(slack, DM, ALICE, "tok-old what day is it")
    answered(slack, DM, None, "re tok-old", old)
    new, new_event = says(slack, DM, ALICE, "tok-new and the time?")
    async with SlackRig(store, tmp_path, slack, run_tasks=False, restored=True) as rig:
        assert (await rig.send(new_event))[0] == 200
        await until_taken(rig, new)
        assert (await rig.send(old_event, retry_num=1))[0] == 200
        await until_taken(rig, old)
        rig.start_runner()
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == ["re tok-old",
                                                          "echo: tok-new and the time?"]


async def until_taken(rig: SlackRig, message: dict) -> None:
    """Until the connector has taken `message` in (the runner is off)."""
    for _ in range(400):
        if await rig.store.submission_state("slack", f"{DM}:{message['ts']}") is not None \
                and rig.connector.inbox.lanes.busy == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{message['text']!r} not taken in")


async def test_a_reply_taken_in_as_history_is_listed_by_the_answer_that_covered_it(
        store, tmp_path, slack):
    """Alice's first thread reply reaches Steward late, after her second: the thread's
    history brings the first in with the second, and the answer covers both. Its metadata
    says so, and a home restored from a backup, given the late event, answers nothing."""
    top, top_event = says(slack, DM, ALICE, "tok-top what time is it?")
    async with SlackRig(store, tmp_path, slack) as rig:
        assert (await rig.send(top_event))[0] == 200
        await rig.settle()
        first, first_event = says(slack, DM, ALICE, "tok-first look at the clock",
                                  thread_ts=top["ts"])
        _, second_event = says(slack, DM, ALICE, "tok-second and the day?",
                               thread_ts=top["ts"])
        assert (await rig.send(second_event))[0] == 200
        await rig.settle()
    [answer] = slack.bot_messages(DM, top["ts"])
    payload = answer["metadata"]["event_payload"]
    assert first["ts"] in payload.get("answers", []), payload

    # The restored home (its own store: what the snapshot held, the top message answered)
    fresh = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'restored.db'}")
    try:
        async with SlackRig(fresh, tmp_path / "restored", slack, restored=True) as rig:
            assert (await rig.send(first_event, retry_num=1))[0] == 200
            await rig.settle()
    finally:
        await fresh.close()
    assert len(slack.bot_messages(DM, top["ts"])) == 1  # nothing answered twice


async def test_an_answer_in_a_dm_thread_does_not_claim_the_dm_message_it_hangs_under(
        store, tmp_path, slack):
    """The restore test's seed 550600: Alice's DM message came while no home ran, her
    reply in its thread after the restore. The reply's event came first: the thread was
    taken in with the DM message as its history, and the answer to the reply said it
    answered that message too (an earlier message of the asker's). It does not: the DM
    message is the DM's, answered at its top level. A restored home, given its event next,
    took it as answered by the thread's answer and never answered it."""
    top, top_event = says(slack, DM, ALICE, "tok-top can you check the time?")
    _, reply_event = says(slack, DM, ALICE, "tok-reply how are we doing?",
                          thread_ts=top["ts"])
    async with SlackRig(store, tmp_path, slack, restored=True) as rig:
        assert (await rig.send(reply_event))[0] == 200
        await rig.settle()
        [answer] = slack.bot_messages(DM, top["ts"])
        assert top["ts"] not in answer["metadata"]["event_payload"].get("answers", [])
        assert (await rig.send(top_event, retry_num=1))[0] == 200
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM) if "thread_ts" not in m] == [
        "echo: tok-top can you check the time?"]
