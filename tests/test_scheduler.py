"""The scheduler against the store, on both backends, with a controllable clock."""

import asyncio
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import httpx
import pytest

from bot.app.config import build_config
from bot.app.wiring import wire
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, ToolCall
from bot.runtime import RunnerOptions
from bot.scheduler.loop import Scheduler
from bot.scheduler.tool import schedule as schedule_tool
from bot.tools import ToolBox, ToolContext
from bot.tools.permissions import Recipients
from connectors.email.channel import EmailChannel
from connectors.email.config import EmailConfig
from connectors.slack.outbound import SlackChannel
from store import DONE, ScheduleWrite, Writes, new_id

TZ = "Europe/Vienna"


def ts(*args) -> float:
    return datetime(*args, tzinfo=ZoneInfo(TZ)).timestamp()


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def app(store, tmp_path):
    """The real wiring with a model that says the reminder, and the schedule tool."""
    async def answer(request):
        return Response(text="Reminder: " + request.messages[-1].content.splitlines()[-1])

    async with httpx.AsyncClient() as http:
        yield wire(build_config({}, home=tmp_path), store, ScriptedModel(answer), http,
                   toolbox=ToolBox(schedule_tool), options=RunnerOptions(poll_seconds=0.02))


@pytest.fixture
def deps(app):
    return app.deps


async def add(store, spec, next_at, *, catchup="latest", conversation_id=None) -> str:
    sid = new_id()
    w = Writes()
    w.save_schedule(ScheduleWrite(sid, "test", "Water the plants.", spec, TZ,
                                  {"channel": "cli", "reply_to": {}}, next_at,
                                  conversation_id, catchup=catchup))
    await store.commit(w)
    return sid


async def occurrences(store, sid):
    turns = await store.list_tasks(kind="turn", limit=1000)
    return [t for t in turns if t.inputs.get("schedule") == sid]


async def test_a_due_occurrence_fires_once_however_often_it_is_checked(store, deps):
    sid = await add(store, {"kind": "cron", "expr": "0 9 * * *"}, ts(2026, 12, 1, 9))
    clock = Clock(ts(2026, 12, 1, 9, 0, 2))
    first, second = Scheduler(deps, clock=clock), Scheduler(deps, clock=clock)
    counts = await asyncio.gather(first.fire_due(), second.fire_due(), first.fire_due())
    assert sum(counts) == 1
    [turn] = await occurrences(store, sid)
    assert turn.inputs["occurrence"] == "2026-12-01T09:00:00+01:00"
    s = await store.get_schedule(sid)
    assert (s.next_fire_at, s.fired) == (ts(2026, 12, 2, 9), 1)
    conv = await store.get_conversation(f"schedule:{sid}")  # a dedicated conversation
    [entry] = await store.entries_page(conv.id)
    assert entry.text.endswith("Water the plants.") and not entry.data["late"]


async def test_missed_occurrences_fire_the_latest_once_and_say_it_is_late(store, deps):
    sid = await add(store, {"kind": "cron", "expr": "0 * * * *"}, ts(2026, 12, 1, 1))
    clock = Clock(ts(2026, 12, 1, 5, 30))  # down from before 01:00 until 05:30
    assert await Scheduler(deps, clock=clock).fire_due() == 1
    assert await Scheduler(deps, clock=clock).fire_due() == 0  # no burst
    [turn] = await occurrences(store, sid)
    assert turn.inputs["occurrence"].startswith("2026-12-01T05:00")
    conv = await store.get_conversation(f"schedule:{sid}")
    [entry] = await store.entries_page(conv.id)
    assert entry.data["late"] and entry.data["missed"] == 4
    assert "it is late" in entry.text
    assert (await store.get_schedule(sid)).next_fire_at == ts(2026, 12, 1, 6)


async def test_catch_up_all_fires_each_missed_one_in_order(store, deps):
    sid = await add(store, {"kind": "cron", "expr": "0 * * * *"}, ts(2026, 12, 1, 1),
                    catchup="all")
    scheduler = Scheduler(deps, clock=Clock(ts(2026, 12, 1, 3, 30)))
    assert [await scheduler.fire_due() for _ in range(4)] == [1, 1, 1, 0]
    fired = sorted(t.inputs["occurrence"][11:16] for t in await occurrences(store, sid))
    assert fired == ["01:00", "02:00", "03:00"]


async def test_catch_up_skip_fires_nothing_late(store, deps):
    sid = await add(store, {"kind": "cron", "expr": "0 * * * *"}, ts(2026, 12, 1, 1),
                    catchup="skip")
    assert await Scheduler(deps, clock=Clock(ts(2026, 12, 1, 3, 30))).fire_due() == 0
    assert await occurrences(store, sid) == []
    assert (await store.get_schedule(sid)).next_fire_at == ts(2026, 12, 1, 4)


async def test_a_one_off_is_done_after_it_fires(store, deps):
    sid = await add(store, {"kind": "date", "at": "2026-12-03T09:00"}, ts(2026, 12, 3, 9))
    assert await Scheduler(deps, clock=Clock(ts(2026, 12, 3, 9, 0, 1))).fire_due() == 1
    s = await store.get_schedule(sid)
    assert (s.state, s.next_fire_at) == ("done", None)


async def test_a_broken_schedule_is_retired_and_the_others_still_fire(store, deps):
    bad = await add(store, {"kind": "cron", "expr": "nonsense"}, ts(2026, 12, 1, 9))
    good = await add(store, {"kind": "cron", "expr": "0 9 * * *"}, ts(2026, 12, 1, 9))
    assert await Scheduler(deps, clock=Clock(ts(2026, 12, 1, 9, 1))).fire_due() == 1
    assert (await store.get_schedule(bad)).state == "failed"
    assert len(await occurrences(store, good)) == 1


async def test_the_occurrence_is_answered_in_the_conversation_that_asked(store, app, deps):
    conv = await store.ensure_conversation("cli:mine")
    sid = await add(store, {"kind": "cron", "expr": "0 9 * * *"}, ts(2026, 12, 1, 9),
                    conversation_id=conv.id)
    await Scheduler(deps, clock=Clock(ts(2026, 12, 1, 9))).fire_due()
    runner = app.runner
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    [turn] = await occurrences(store, sid)
    assert turn.state == DONE
    assert [e.kind for e in await store.entries_page(conv.id)] == ["user", "assistant"]
    assert turn.result["text"] == "Reminder: Water the plants."
    [delivery] = await store.list_tasks(kind="deliver")
    assert delivery.state == DONE and delivery.inputs["channel"] == "cli"


def addressing() -> dict:
    """The Slack and email channels, only to address someone new: no server behind them
    (addressing asks none)."""
    email = EmailConfig(enabled=True, address="steward@example.org", imap_host="imap.test",
                        smtp_host="smtp.test")
    return {"slack": SlackChannel(None, None, None),  # type: ignore[arg-type]
            "email": EmailChannel(email, open_session=None, smtp_password=None,
                                  sender_name="Steward")}


async def test_a_time_that_passed_while_the_model_worked_is_due_at_once(store, deps):
    """"Remind me in 1 second": the model writes an absolute time, which on a slow model
    or a loaded machine has passed when the tool runs; a time after the question was asked
    is not refused for that, it is due now. One before the question still is refused."""
    conv = await store.ensure_conversation("cli:late")
    asked = time.time() - 5

    async def call(at: str) -> str:
        ctx = ToolContext(store=store, task_id=new_id(), conversation_id=conv.id,
                          http=deps.http, timezone="UTC", asked_at=asked)
        result = await schedule_tool.run(ctx, {"action": "create", "name": at, "prompt": "x",
                                               "at": at, "timezone": "UTC"})
        await store.commit(ctx.writes)
        return result.content

    def utc(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S")

    before = time.time()
    assert (await call(utc(asked + 2))).startswith("Scheduled"), "passed while it worked"
    [s] = await store.list_schedules()
    assert before - 1 <= s.next_fire_at <= time.time()
    assert (await call(utc(asked - 60))).startswith("error: that time has already passed")


async def test_the_schedule_tool_creates_lists_changes_and_cancels(store, deps):
    conv = await store.ensure_conversation("cli:tool")

    origin = {"channel": "slack", "reply_to": {"channel": "D1", "user": "U1", "team": "T"}}
    channels = addressing()

    async def call(**arguments):
        ctx = ToolContext(store=store, task_id=new_id(), conversation_id=conv.id,
                          http=deps.http, timezone=TZ, origin=origin,
                          recipients=Recipients.of(["ana@example.org"], ["slack", "email"]),
                          channels=channels)
        result = await schedule_tool.run(ctx, arguments)
        await store.commit(ctx.writes)
        return result.content

    made = await call(action="create", name="plants", prompt="Remind me to water the plants.",
                      cron="0 8 * * mon")
    assert made.startswith("Scheduled 'plants'")
    [s] = await store.list_schedules()
    assert (s.trigger, s.deliver["channel"], s.timezone) == (
        {"kind": "cron", "expr": "0 8 * * mon"}, "slack", TZ)
    assert "plants" in await call(action="list")
    await call(action="change", schedule_id=s.id, every_minutes=90)
    changed = await store.get_schedule(s.id)
    assert {k: changed.trigger[k] for k in ("kind", "seconds")} == {"kind": "interval",
                                                                     "seconds": 5400}
    assert (changed.conversation_id, changed.deliver) == (s.conversation_id, s.deliver)
    assert await call(action="cancel", schedule_id=s.id) == "Cancelled 'plants'."
    assert (await store.get_schedule(s.id)).state == "cancelled"
    assert "is cancelled" in await call(action="change", schedule_id=s.id, every_minutes=5)
    assert (await store.get_schedule(s.id)).state == "cancelled"  # not brought back
    assert await call(action="list") == "No active schedules here."
    assert (await call(action="create", name="x", prompt="y", at="2020-01-01T09:00")
            ).startswith("error: that time has already passed")
    assert "exactly one" in await call(action="create", name="x", prompt="y")

    await call(action="create", name="digest", prompt="Mail me my open to-dos.",
               cron="0 7 * * mon", deliver_to="email", email="ana@example.org")
    await call(action="create", name="ping", prompt="Say hi.", cron="0 7 * * *",
               deliver_to="slack_dm")
    by_name = {s.name: s for s in await store.list_schedules()}
    assert by_name["digest"].deliver == {"channel": "email", "reply_to": {
        "to": "ana@example.org", "subject": "digest"}}
    assert by_name["digest"].conversation_id is None  # its own conversation
    assert by_name["ping"].deliver["reply_to"]["channel"] == "U1"  # the user's DM
    origin["channel"] = "cli"
    assert "slack_dm works from a Slack conversation" in (await call(
        action="create", name="p", prompt="q", cron="0 7 * * *", deliver_to="slack_dm"))


async def test_a_changed_interval_fires_where_the_tool_said(store, deps, monkeypatch):
    # The tool computes the first fire when the interval is set; the scheduler re-creates
    # the trigger at every occurrence: both must count from the same start.
    conv = await store.ensure_conversation("cli:interval")
    t0 = ts(2026, 3, 2, 9, 0)
    monkeypatch.setattr("bot.scheduler.tool.time.time", lambda: t0)

    async def call(**arguments):
        ctx = ToolContext(store=store, task_id=new_id(), conversation_id=conv.id,
                          http=deps.http, timezone=TZ, origin={"channel": "cli"})
        result = await schedule_tool.run(ctx, arguments)
        await store.commit(ctx.writes)
        return result.content

    await call(action="create", name="stretch", prompt="Stretch.", every_minutes=60)
    [s] = await store.list_schedules()
    assert s.next_fire_at == t0 + 3600
    t0 += 25 * 60  # changed 25 minutes later: every 90 minutes from now
    await call(action="change", schedule_id=s.id, every_minutes=90)
    s = await store.get_schedule(s.id)
    assert s.next_fire_at == t0 + 90 * 60
    fires = []
    clock = Clock(s.next_fire_at)
    scheduler = Scheduler(deps, clock=clock)
    for _ in range(3):
        assert await scheduler.fire_due() == 1
        fires.append(clock.t)
        clock.t = (await store.get_schedule(s.id)).next_fire_at
    assert [b - a for a, b in zip(fires, fires[1:], strict=False)] == [90 * 60] * 2
    assert fires[0] == t0 + 90 * 60


async def test_schedules_are_touched_only_by_whoever_made_them(store, deps):
    ana = await store.ensure_conversation("slack:T:D1", owner="slack:T:U1")
    bob = await store.ensure_conversation("slack:T:D2", owner="slack:T:U2")

    async def call(conv, **arguments):
        ctx = ToolContext(store=store, task_id=new_id(), conversation_id=conv.id,
                          http=deps.http, timezone=TZ, origin={"channel": "cli"})
        result = await schedule_tool.run(ctx, arguments)
        await store.commit(ctx.writes)
        return result.content

    await call(ana, action="create", name="pills", prompt="Pills.", cron="0 8 * * *")
    [s] = await store.list_schedules()
    assert s.owner == "slack:T:U1"
    assert await call(bob, action="cancel", schedule_id=s.id) == f"error: no schedule {s.id}"
    assert "error" in await call(bob, action="change", schedule_id=s.id, cron="0 9 * * *")
    assert (await store.get_schedule(s.id)).state == "active"
    assert await call(ana, action="cancel", schedule_id=s.id) == "Cancelled 'pills'."


async def test_the_agent_schedules_through_its_tool(store, app, deps, tmp_path):
    model = ScriptedModel([
        Response(tool_calls=[ToolCall(id="s1", name="schedule", arguments={
            "action": "create", "name": "standup", "prompt": "Say good morning.",
            "cron": "0 9 * * mon-fri"})]),
        Response(text="Done, every weekday at 9.")])
    deps.client = model
    from bot.agent.inbox import submit_message
    await submit_message(store, channel="cli", external_ids=["m1"],
                         conversation_key="cli:agent", text="every weekday at 9 say hi")
    runner = app.runner
    await asyncio.wait_for(runner.run(until_idle=True), 30)
    [s] = await store.list_schedules()
    assert s.name == "standup" and s.conversation_id is not None
