"""A schedule delivered to the user's Slack DM, end to end against the fake Slack: the
schedule tool addresses the person (their U... id), the Slack channel opens the DM
(conversations.open) and posts there, once. Slack's conversations.history and
chat.postMessage do not take a person's id (the fake answers channel_not_found, as Slack
does for history), so only the DM's own id works."""

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

import pytest

from bot.channels import Outbound
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Request, Response, ToolCall
from bot.scheduler.loop import Scheduler
from bot.scheduler.tool import schedule as schedule_tool
from tests.fakes.slack_events import mention_of, mentions, says
from tests.fakes.slack_harness import SlackRig, last_user_text
from tests.fakes.slack_server import TEAM, FakeSlack

ALICE = "U0ALICE"
CHAN = "C0GENERAL"
REMINDER = "Time to water the plants!"


@pytest.fixture
def slack():
    with FakeSlack() as fake:
        fake.add_user(ALICE, "Alice")
        yield fake


def reminding_model() -> ScriptedModel:
    """Asked for a reminder: schedules one for two seconds from now, to the user's DM.
    Given the occurrence: says REMINDER."""
    def reply(request: Request) -> Response:
        if request.messages[-1].role == "tool":
            return Response(text=f"Noted: {request.messages[-1].content}")
        said = last_user_text(request)
        if "[Scheduled:" in said:
            return Response(text=REMINDER)
        at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat(timespec="seconds")
        return Response(tool_calls=[ToolCall(id="c1", name="schedule", arguments={
            "action": "create", "name": "plants", "at": at, "deliver_to": "slack_dm",
            "prompt": "Remind the user to water the plants."})])
    return ScriptedModel(reply)


async def until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def tick(scheduler: Scheduler) -> None:
    """The scheduler's passes, more often than its own loop makes them."""
    while True:
        await scheduler.fire_due()
        await asyncio.sleep(0.1)


async def test_a_reminder_for_the_slack_dm_arrives_there_once(store, tmp_path, slack):
    dm = slack.dm_of(ALICE)
    async with SlackRig(store, tmp_path, slack, client=reminding_model(),
                        tools=[schedule_tool]) as rig:
        scheduler = Scheduler(rig.deps)
        ticking = asyncio.create_task(tick(scheduler))
        try:
            # Asked in a channel, answered in its thread; the reminder goes to the DM.
            top, _ = says(slack, CHAN, ALICE, mentions("remind me to water the plants"))
            await rig.send(mention_of(top, CHAN))
            await until(lambda: slack.bot_messages(CHAN), 20, "the answer in the thread")
            [schedule] = await store.list_schedules()
            assert schedule.deliver["reply_to"]["channel"] == ALICE  # the person, not a DM
            await until(lambda: slack.bot_messages(dm), 20, "the reminder in the DM")
            await asyncio.sleep(0.5)  # room for a wrong second post
            await rig.settle()
        finally:
            ticking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticking
    [reminder] = slack.bot_messages(dm)
    assert reminder["text"] == REMINDER
    assert reminder["metadata"]["event_payload"]["key"].endswith(".answer")
    [thread_answer] = slack.bot_messages(CHAN)
    assert thread_answer["thread_ts"] == top["ts"] and "Scheduled 'plants'" in \
        thread_answer["text"]
    assert [c.params.get("users") for c in slack.calls_of("conversations.open")] == [ALICE]
    assert not [c for c in slack.calls if c.params.get("channel") == ALICE]
    assert {t.state for t in await store.list_tasks(limit=50)} == {"done"}
    assert (await store.get_schedule(schedule.id)).fired == 1


async def test_a_dm_addressed_to_the_person_is_found_again_after_a_restart(
        store, tmp_path, slack):
    where = {"team": TEAM, "channel": ALICE, "user": ALICE}  # as the schedule tool has it
    message = Outbound(key="R1.answer", conversation_key="schedule:R1", conversation_id=1,
                       text="first", reply_to=where)
    async with SlackRig(store, tmp_path, slack) as rig:
        shown = await rig.connector.channel.send(message)
        assert shown["channel"] == slack.dm_of(ALICE)
        assert await rig.connector.channel.send(message) == shown
    async with SlackRig(store, tmp_path, slack) as rig:  # nothing in memory: opened again
        found = await rig.connector.channel.find(message)
        assert found is not None and found["ts"] == shown["ts"]
        await rig.connector.channel.send(Outbound(**{**message.__dict__, "text": "second"}))
    assert [m["text"] for m in slack.bot_messages(slack.dm_of(ALICE))] == ["second"]
    assert slack.count("chat.postMessage") == 1
    assert slack.count("conversations.open") == 2  # once per process
