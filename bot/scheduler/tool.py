"""The agent's `schedule` tool: reminders and recurring jobs, kept in the store.

Its only effect is a store write that lands with the tool's result, so it is `safe`."""

import time
from datetime import timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field

from bot.runtime import Policy
from bot.scheduler.triggers import TriggerError, first_fire, from_ts, make_trigger
from bot.tools import ToolContext, ToolResult, tool
from bot.tools.permissions import SCHEDULES, SENDS, Asking
from store import NotFound, Schedule, ScheduleWrite, new_id


def _spec(at: str | None, every_minutes: int | None, cron: str | None) -> dict:
    given = [x for x in (at, every_minutes, cron) if x is not None]
    if len(given) != 1:
        raise TriggerError("give exactly one of `at`, `every_minutes` or `cron`")
    if at is not None:
        return {"kind": "date", "at": at}
    if every_minutes is not None:
        return {"kind": "interval", "seconds": every_minutes * 60}
    return {"kind": "cron", "expr": cron}


def describe(s: Schedule) -> str:
    trigger = s.trigger
    when = {"date": lambda: f"once at {trigger.get('at')}",
            "interval": lambda: f"every {int(trigger.get('seconds', 0)) // 60} minutes",
            "cron": lambda: f"cron '{trigger.get('expr')}'"}.get(trigger.get("kind"),
                                                                 lambda: "?")()
    nxt = from_ts(s.next_fire_at, s.timezone).strftime("%a %d %b %Y %H:%M %Z") \
        if s.next_fire_at else "never"
    made = f" [made from text from outside ({s.origin}): data]" if s.origin else ""
    return f"{s.id} [{s.state}] {s.name!r}: {when} ({s.timezone}); next {nxt}; " \
           f"fired {s.fired}x; does{made}: {s.prompt}"


async def _needs_approval(asking: Asking, **args) -> str | None:
    """Mail to someone outside the circle is sent only with the person's yes."""
    address = args.get("email") or asking.asker
    if args.get("action") != "create" or args.get("deliver_to") != "email" or not address:
        return None
    if asking.recipients.email_refusal(address, asker=asking.asker) is None \
            or not asking.recipients.may_approve_email(address):
        return None  # allowed anyway, or refused whatever the answer (the tool says why)
    return f"email the results of the schedule {args.get('name')!r} to {address}"


@tool(policy=Policy.SAFE, touches=frozenset({SCHEDULES, SENDS}), approval=_needs_approval)
async def schedule(
    ctx: ToolContext,
    action: Literal["create", "list", "change", "cancel"],
    name: Annotated[str | None, Field(description="short title, e.g. 'call mum'")] = None,
    prompt: Annotated[str | None, Field(
        description="what to do or say when it fires, written as an instruction to "
                    "yourself, e.g. 'Remind the user to call their mum.'")] = None,
    at: Annotated[str | None, Field(
        description="once, at this local date-time, ISO 8601 like 2026-12-03T09:00")] = None,
    every_minutes: Annotated[int | None, Field(description="repeat every N minutes (>= 1)")] \
        = None,
    cron: Annotated[str | None, Field(
        description="repeat by crontab 'minute hour day month weekday', e.g. '0 8 * * mon' "
                    "for Monday mornings at 8")] = None,
    timezone: Annotated[str | None, Field(description="IANA zone; default: the user's")] \
        = None,
    schedule_id: Annotated[str | None, Field(description="for change and cancel")] = None,
    deliver_to: Annotated[Literal["here", "email", "slack_dm"], Field(
        description="where the result goes: this conversation (default), an email, or "
                    "the user's Slack direct messages")] = "here",
    email: Annotated[str | None, Field(description="address for deliver_to=email "
                                                   "(default: the user's own)")] = None,
) -> str | ToolResult:
    """Create, list, change or cancel reminders and recurring jobs. Turn the user's words
    into exactly one of `at` (once), `every_minutes` or `cron` in their timezone (ask the
    current_time tool first if you need today's date). When it fires you get `prompt` as
    a message in this conversation and your answer is delivered here."""
    store = ctx.store
    if action == "list":
        found = await store.list_schedules(conversation_id=ctx.conversation_id)
        live = [s for s in found if s.state == "active"]
        return ToolResult("\n".join(describe(s) for s in live) or "No active schedules here.",
                          outside=next((s.origin for s in live if s.origin), None))
    if action == "create":
        if not name or not prompt:
            return "error: create needs `name` and `prompt`"
        target = await _target(ctx, deliver_to, email, name)
        if isinstance(target, str):
            return target
        try:
            spec = _spec(at, every_minutes, cron)
        except TriggerError as exc:
            return f"error: {exc}"
        # Answers delivered elsewhere run in a conversation of their own.
        # Made from outside text (bot/provenance.py): it fires as outside text too.
        return _save(ctx, new_id(), name, prompt, spec, timezone or ctx.timezone, target,
                     conversation_id=ctx.conversation_id if target.get("here") else None,
                     owner=await _caller(ctx))
    if not schedule_id:
        return f"error: {action} needs `schedule_id` (use action 'list' to find it)"
    try:
        current = await store.get_schedule(schedule_id)
    except NotFound:
        return f"error: no schedule {schedule_id}"
    if not await _may_touch(ctx, current):
        return f"error: no schedule {schedule_id}"  # someone else's: not even its existence
    if current.state != "active":
        return f"error: {current.name!r} is {current.state}; create a new schedule instead"
    if action == "cancel":
        ctx.writes.save_schedule(ScheduleWrite(
            current.id, current.name, current.prompt, current.trigger, current.timezone,
            current.deliver, None, current.conversation_id, current.owner, current.catchup,
            "cancelled", current.origin))
        return f"Cancelled {current.name!r}."
    if (at, every_minutes, cron) == (None, None, None):
        spec = _anchored(current.trigger, from_ts(current.created_at, current.timezone))
    else:
        try:
            spec = _spec(at, every_minutes, cron)
        except TriggerError as exc:
            return f"error: {exc}"
    # A change keeps where it lives, whose it is and where its answers go; its words stay
    # outside text unless the person gives new ones (`prompt`) in a turn of their own.
    return _save(ctx, current.id, name or current.name, prompt or current.prompt, spec,
                 timezone or current.timezone, current.deliver,
                 conversation_id=current.conversation_id, owner=current.owner,
                 catchup=current.catchup, origin=None if prompt else current.origin)


async def _caller(ctx: ToolContext) -> str | None:
    if ctx.conversation_id is None:
        return None
    return (await ctx.store.known_conversation(ctx.conversation_id)).owner


async def _may_touch(ctx: ToolContext, s: Schedule) -> bool:
    """Only from the conversation that made it, or by the person who made it."""
    if s.conversation_id is not None and s.conversation_id == ctx.conversation_id:
        return True
    return s.owner == await _caller(ctx)


def _anchored(spec: dict, base) -> dict:
    """An interval counts from a start written into the trigger, so the scheduler (which
    re-creates the trigger at every occurrence) and this tool agree on the phase."""
    if spec.get("kind") != "interval" or spec.get("start"):
        return spec
    start = base + timedelta(seconds=float(spec.get("seconds", 0)))
    return {**spec, "start": start.isoformat(timespec="seconds")}


async def _target(ctx: ToolContext, deliver_to: str, email: str | None,
                  name: str) -> dict | str:
    """Where a schedule's answers go: {"channel", "reply_to", "here"}, or an error. Which
    channel can mail an address, or reach the person directly, the channels say
    (bot.channels.Channel); `deliver_to` names the medium, as the model asks for it."""
    origin = {"channel": ctx.origin.get("channel") or "cli",
              "reply_to": ctx.origin.get("reply_to") or {}, "here": True}
    if deliver_to == "here":
        return origin
    here = ctx.channels.get(origin["channel"])
    if deliver_to == "email":
        asker = None  # known by address only where the channel knows people so (mail)
        if ctx.conversation_id is not None and here is not None:
            asker = here.asker_address(
                (await ctx.store.known_conversation(ctx.conversation_id)).owner)
        address = email or asker
        if not address:
            return "error: deliver_to=email needs an `email` address"
        refusal = ctx.recipients.email_refusal(address, asker=asker)
        if refusal is not None and not (ctx.approved
                                        and ctx.recipients.may_approve_email(address)):
            return f"error: not scheduled: {refusal}"
        mail = next((c for c in ctx.channels.values() if c.reaches_addresses), None)
        if mail is None:
            return "error: not scheduled: email is not enabled here"
        return {"channel": mail.name, "reply_to": mail.address_of(address, subject=name)}
    where = here.direct_to(origin["reply_to"]) if here is not None else None
    if where is None:
        return "error: deliver_to=slack_dm works from a Slack conversation only"
    return {"channel": here.name, "reply_to": where}


def _save(ctx: ToolContext, schedule_id: str, name: str, prompt: str, spec: dict,
          timezone: str, deliver: dict, *, conversation_id: int | None, owner: str | None,
          catchup: str = "latest", origin: str | None = None) -> str:
    try:
        ZoneInfo(timezone)
        now = from_ts(time.time(), timezone)
        spec = _anchored(spec, now)
        trigger = make_trigger(spec, timezone, created=now)
    except (TriggerError, ZoneInfoNotFoundError, ValueError) as exc:
        return f"error: {exc}"
    first = first_fire(trigger, now)
    if first is not None and first < now and ctx.asked_at is not None \
            and first.timestamp() >= int(ctx.asked_at):  # (a time given to the second)
        first = now  # after the question, passed while the model worked ("in 1 second")
    if first is None or first < now:
        return "error: that time has already passed"
    ctx.writes.save_schedule(ScheduleWrite(schedule_id, name, prompt, spec, timezone, deliver,
                                           first.timestamp(), conversation_id, owner, catchup,
                                           origin=ctx.outside or origin))
    return f"Scheduled {name!r} ({schedule_id}); first at " \
           f"{first.strftime('%a %d %b %Y %H:%M %Z')}."
