"""A schedule delivered to the user's Slack DM, end to end against the fake Slack: the
schedule tool addresses the person (their U... id), the Slack channel opens the DM
(conversations.open) and posts there, once. Slack's conversations.history and
chat.postMessage do not take a person's id (the fake answers channel_not_found, as Slack
does for history), so only the DM's own id works."""

import asyncio
import contextlib
import time
from datetime import UTC, date, datetime, timedelta
from datetime import time as dt_time
from zoneinfo import ZoneInfo

import pytest

from bot.channels import Outbound
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Request, Response, ToolCall
from bot.scheduler.loop import Scheduler
from bot.scheduler.tool import schedule as schedule_tool
from bot.tools.builtin import current_time
from tests.fakes.slack_events import mention_of, mentions, says
from tests.fakes.slack_rig import SlackRig, last_user_text
from tests.fakes.slack_server import TEAM

ALICE = "U0ALICE"
CHAN = "C0GENERAL"
REMINDER = "Time to water the plants!"


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


# -- the asker's timezone -------------------------------------------------------------

BOB, CAROL, DAVE = "U0BOB", "U0CAROL", "U0DAVE"
CONFIGURED = "Europe/Vienna"  # Steward's `[agent] timezone`
NEW_YORK = "America/New_York"


def the_day() -> date:
    """A day whose 09:00 is still ahead in every zone."""
    return (datetime.now(UTC) + timedelta(days=2)).date()


def nine_oclock_model() -> ScriptedModel:
    """Asked for a reminder: asks the time and schedules one at 09:00 on `the_day()`, in
    the asker's (unnamed) zone, here; answers with what the tools said. Given the
    occurrence: asks the time again and answers with it."""
    def reply(request: Request) -> Response:
        if request.messages[-1].role == "tool":
            done = [m.content for m in request.messages[-2:] if m.role == "tool"]
            return Response(text="Noted: " + " | ".join(done))
        if "[Scheduled:" in last_user_text(request):
            return Response(tool_calls=[ToolCall(id="t1", name="current_time", arguments={})])
        return Response(tool_calls=[
            ToolCall(id="c1", name="current_time", arguments={}),
            ToolCall(id="c2", name="schedule", arguments={
                "action": "create", "name": "standup", "at": f"{the_day()}T09:00",
                "prompt": "Remind the user of the standup."})])
    return ScriptedModel(reply)


def zone_rig(store, tmp_path, slack, **kwargs) -> SlackRig:
    return SlackRig(store, tmp_path, slack, client=nine_oclock_model(),
                    tools=[schedule_tool, current_time], agent={"timezone": CONFIGURED},
                    allowed_users=[ALICE, BOB, CAROL, DAVE], **kwargs)


def asks(slack, user: str) -> tuple[str, dict]:
    dm = slack.dm_of(user)
    _, body = says(slack, dm, user, "remind me of the standup at 9 the day after tomorrow")
    return dm, body


async def tool_results(store, conversation_id: int) -> dict[str, str]:
    page = await store.entries_page(conversation_id, limit=50)
    return {e.data["name"]: e.text for e in page if e.kind == "tool_result"}


async def test_a_slack_user_in_another_zone_gets_their_schedule_at_nine_their_time(
        store, tmp_path, slack):
    slack.add_user(BOB, "Bob", tz=NEW_YORK)
    nine = datetime.combine(the_day(), dt_time(9, 0), ZoneInfo(NEW_YORK))
    async with zone_rig(store, tmp_path, slack) as rig:
        dm, body = asks(slack, BOB)
        await rig.send(body)
        await until(lambda: slack.bot_messages(dm), 20, "the answer")
        await rig.settle()
        [schedule] = await store.list_schedules()
        assert schedule.timezone == NEW_YORK
        assert schedule.next_fire_at == nine.timestamp()
        said = await tool_results(store, schedule.conversation_id)
        assert f"timezone {NEW_YORK}" in said["current_time"]
        assert "09:00 E" in said["schedule"]  # EST or EDT: their nine, not Vienna's
        [turn] = await store.list_tasks(kind="turn", limit=5)
        assert turn.inputs["timezone"] == NEW_YORK  # stored with the turn

        # It fires at nine in New York, not a second before, and only once.
        now = [nine.timestamp() - 1]
        scheduler = Scheduler(rig.deps, clock=lambda: now[0])
        assert await scheduler.fire_due() == 0
        now[0] = nine.timestamp()
        assert await scheduler.fire_due() == 1
        assert await scheduler.fire_due() == 0
        await until(lambda: len(slack.bot_messages(dm)) == 2, 20, "the reminder")
        await rig.settle()
    occurrence = next(t for t in await store.list_tasks(kind="turn", limit=5)
                      if t.inputs.get("schedule"))
    assert occurrence.inputs["occurrence"] == nine.isoformat()
    assert datetime.fromisoformat(occurrence.inputs["occurrence"]).astimezone(
        ZoneInfo(NEW_YORK)).hour == 9
    # The occurrence's own turn speaks the schedule's zone too.
    reminder = slack.bot_messages(dm)[-1]["text"]
    assert f"timezone {NEW_YORK}" in reminder


@pytest.mark.parametrize("tz", [None, "", "Mars/Olympus", "localtime", "../etc/passwd"])
async def test_without_a_valid_slack_zone_the_configured_one_is_used(
        store, tmp_path, slack, tz):
    slack.add_user(CAROL, "Carol", tz=tz)
    nine = datetime.combine(the_day(), dt_time(9, 0), ZoneInfo(CONFIGURED))
    async with zone_rig(store, tmp_path, slack) as rig:
        dm, body = asks(slack, CAROL)
        await rig.send(body)
        await until(lambda: slack.bot_messages(dm), 20, "the answer")
        await rig.settle()
    [schedule] = await store.list_schedules()
    assert (schedule.timezone, schedule.next_fire_at) == (CONFIGURED, nine.timestamp())
    said = await tool_results(store, schedule.conversation_id)
    assert f"timezone {CONFIGURED}" in said["current_time"]
    [turn] = await store.list_tasks(kind="turn", limit=5)
    assert "timezone" not in turn.inputs


async def test_a_turn_resumed_after_a_restart_keeps_the_zone_its_message_came_with(
        store, tmp_path, slack):
    slack.add_user(DAVE, "Dave", tz=NEW_YORK)
    nine = datetime.combine(the_day(), dt_time(9, 0), ZoneInfo(NEW_YORK))
    async with zone_rig(store, tmp_path, slack, run_tasks=False) as rig:
        dm, body = asks(slack, DAVE)
        await rig.send(body)
        deadline = time.monotonic() + 60
        while not await store.list_tasks(kind="turn", limit=1):
            assert time.monotonic() < deadline, "the event was not taken in"
            await asyncio.sleep(0.05)
        assert not slack.bot_messages(dm)
    # Meanwhile Dave flies to Tokyo; the process that answers never knew him.
    slack.set_tz(DAVE, "Asia/Tokyo")
    async with zone_rig(store, tmp_path, slack) as rig:
        await until(lambda: slack.bot_messages(dm), 20, "the answer")
        await rig.settle()
    [schedule] = await store.list_schedules()
    assert (schedule.timezone, schedule.next_fire_at) == (NEW_YORK, nine.timestamp())
    said = await tool_results(store, schedule.conversation_id)
    assert f"timezone {NEW_YORK}" in said["current_time"]
    [entry] = [e for e in await store.entries_page(schedule.conversation_id, limit=50)
               if e.kind == "user"]
    assert entry.data["timezone"] == NEW_YORK
