"""Trigger maths: APScheduler's triggers keep the calendar; this module adds what a
personal agent needs on top — one fire per wall-clock time across a DST fall-back, and
the latest missed occurrence without a burst.

A trigger spec is plain JSON, stored with the schedule:
    {"kind": "date", "at": "2026-12-03T09:00"}            local time in the schedule's zone
    {"kind": "interval", "seconds": 3600, "start": "..."}  start optional (default: creation)
    {"kind": "cron", "expr": "0 9 * * mon"}                 crontab fields in the zone
"""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

MAX_SCAN = 100_000  # occurrences looked at when catching up, before giving up on exactness


class TriggerError(ValueError):
    pass


def _local(text: str, zone: ZoneInfo) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise TriggerError(f"not an ISO date-time: {text!r}") from None
    return value.replace(tzinfo=zone) if value.tzinfo is None else value.astimezone(zone)


def make_trigger(spec: dict, timezone: str, *, created: datetime | None = None) -> BaseTrigger:
    zone = ZoneInfo(timezone)
    kind = spec.get("kind")
    try:
        if kind == "date":
            return DateTrigger(_local(spec["at"], zone), timezone=zone)
        if kind == "interval":
            seconds = float(spec["seconds"])
            if seconds < 60:
                raise TriggerError("an interval must be at least 60 seconds")
            if spec.get("start"):
                start = _local(spec["start"], zone)
            else:  # "every 2 hours" means the first one in two hours
                start = None if created is None else created + timedelta(seconds=seconds)
            return IntervalTrigger(seconds=seconds, start_date=start, timezone=zone)
        if kind == "cron":
            return CronTrigger.from_crontab(_cron_weekdays(spec["expr"]), timezone=zone)
    except KeyError as exc:
        raise TriggerError(f"{kind} trigger needs {exc.args[0]!r}") from None
    except TriggerError:
        raise
    except (ValueError, TypeError) as exc:
        raise TriggerError(f"bad {kind} trigger: {exc}") from None
    raise TriggerError(f"unknown trigger kind {kind!r} (date, interval or cron)")


_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")  # cron's numbering: 0 (and 7) Sunday


def _cron_weekdays(expr: str) -> str:
    """`expr` with its weekday field as day names. APScheduler 3 reads a crontab's weekday
    numbers with 0 as Monday where cron (and every crontab a person or a model writes) has
    0 and 7 as Sunday: "0 9 * * 1" would fire on Tuesdays. Names mean the same to both."""
    fields = expr.split()
    if len(fields) != 5 or not any(c.isdigit() for c in fields[4]):
        return expr
    days: set[int] = set()
    for item in fields[4].lower().split(","):
        span, _, step = item.partition("/")
        if span == "*":
            first, last = 0, 6
        else:
            a, dash, b = span.partition("-")
            first = _cron_day(a)
            last = _cron_day(b) if dash else (6 if step else first)
            if last == 0 and dash:  # "5-7", "fri-sun": through Sunday
                last = 7
            if last < first:
                raise TriggerError(f"weekday range {span!r} runs backwards")
        if step and not step.isdigit() or step == "0":
            raise TriggerError(f"bad weekday step {item!r}")
        days.update(d % 7 for d in range(first, last + 1, int(step or 1)))
    fields[4] = ",".join(_DAYS[d] for d in sorted(days))
    return " ".join(fields)


def _cron_day(token: str) -> int:
    if token in _DAYS:
        return _DAYS.index(token)
    if token.isdigit() and int(token) <= 7:
        return int(token)
    raise TriggerError(f"not a weekday: {token!r} (0-7 or sun..sat)")


def next_fire(trigger: BaseTrigger, after: datetime, *,
              previous: datetime | None = None) -> datetime | None:
    """The first fire time strictly after `after` (None: the trigger is finished). A
    repeat of `previous`'s wall-clock time (the hour that happens twice when clocks go
    back) is skipped: "every day at 02:30" fires once that day."""
    if isinstance(trigger, DateTrigger):
        run = trigger.run_date
        return run if run > after else None
    candidate = trigger.get_next_fire_time(None, _later(after))
    while (candidate is not None and previous is not None
           and _wall(candidate) == _wall(previous)):
        candidate = trigger.get_next_fire_time(None, _later(candidate))
    return candidate


def _later(moment: datetime) -> datetime:
    """One microsecond later, counted in real time (zoneinfo adds wall-clock time, which
    goes backwards across a fall-back)."""
    return (moment.astimezone(UTC) + timedelta(microseconds=1)).astimezone(moment.tzinfo)


def _wall(moment: datetime) -> tuple:
    return moment.replace(tzinfo=None, fold=0).timetuple()[:6]


def first_fire(trigger: BaseTrigger, now: datetime) -> datetime | None:
    return trigger.get_next_fire_time(None, now)


def latest_due(trigger: BaseTrigger, due: datetime, now: datetime) -> tuple[datetime, int]:
    """(the last occurrence at or before `now`, how many occurred since `due`), counting
    from the first missed one, `due`. Long gaps are not walked one by one for ever."""
    latest, count = due, 1
    while count < MAX_SCAN:
        nxt = next_fire(trigger, latest, previous=latest)
        if nxt is None or nxt > now:
            return latest, count
        latest, count = nxt, count + 1
    return latest, count


def from_ts(ts: float, timezone: str) -> datetime:
    return datetime.fromtimestamp(ts, UTC).astimezone(ZoneInfo(timezone))
