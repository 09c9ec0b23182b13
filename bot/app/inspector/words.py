"""What the owner reads instead of raw rows: a schedule's trigger, a task's state and age,
an approval's wait and an amount of money, each said in words.

Pure functions of their arguments (the clock and the zone are parameters), so each is
tested on its own. A trigger this module cannot put into words is shown as it is stored,
never guessed at: a wrong sentence about when a reminder fires is worse than a crontab.
"""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAY_NAMES = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_DAY_ABBR = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
           "Dec")
_MONTH_ABBR = tuple(m.lower() for m in _MONTHS)

# What a task of each kind is, for the owner (bot/agent/*.py name the kinds).
KINDS = {"turn": "answer", "llm_call": "model call", "tool_call": "tool call",
         "deliver": "delivery", "approval": "approval", "compact": "summary of the past",
         "embed_entries": "indexing for search"}
STATE_WORDS = {"pending": "waiting its turn", "running": "running",
               "waiting": "waiting for its steps", "done": "done", "failed": "failed",
               "interrupted": "interrupted (not repeated: its effect was cut off)",
               "blocked": "blocked"}
RESUMES = "interrupted — will resume"


# -- zones and times -----------------------------------------------------------------------


def zone_of(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def place(zone_name: str) -> str:
    """"Europe/Vienna" -> "Vienna" (the city people say); "UTC" stays "UTC"."""
    return zone_name.rsplit("/", 1)[-1].replace("_", " ") if zone_name else "UTC"


def clock(moment: datetime) -> str:
    """8:00, 17:30 (no leading zero on the hour)."""
    return f"{moment.hour}:{moment.minute:02d}"


def day_month(moment: datetime) -> str:
    return f"{moment.day} {_MONTHS[moment.month - 1]}"


def ago(seconds: float) -> str:
    """How long ago, as a person says it: "just now", "5 min ago", "3 h ago", "2 days ago"."""
    if seconds < 0:
        return "in " + span(-seconds)
    if seconds < 45:
        return "just now"
    return span(seconds) + " ago"


def span(seconds: float) -> str:
    """A duration in its largest sensible unit: "40 s", "5 min", "3 h", "2 days"."""
    seconds = abs(seconds)
    if round(seconds) < 60:
        return f"{seconds:.0f} s"
    if round(seconds / 60) < 60:
        return f"{seconds / 60:.0f} min"
    if round(seconds / 3600) < 48:
        hours = seconds / 3600
        return f"{hours:.0f} h" if hours >= 10 else f"{hours:.1f} h".replace(".0 h", " h")
    return f"{seconds / 86400:.0f} days"


def moment_in_words(t: float | None, zone: ZoneInfo, now: float) -> str:
    """A time as the owner reads it in their zone: "today 09:12", "yesterday 18:03",
    "Tue 2 Dec 09:00", with the year only when it is not this one."""
    if t is None:
        return "-"
    moment = datetime.fromtimestamp(t, UTC).astimezone(zone)
    today = datetime.fromtimestamp(now, UTC).astimezone(zone).date()
    days = (moment.date() - today).days
    hhmm = moment.strftime("%H:%M")
    if days == 0:
        return f"today {hhmm}"
    if days == -1:
        return f"yesterday {hhmm}"
    if days == 1:
        return f"tomorrow {hhmm}"
    year = "" if moment.year == today.year else f" {moment.year}"
    return f"{moment.strftime('%a')} {day_month(moment)}{year} {hhmm}"


# -- schedules ---------------------------------------------------------------------------


def trigger_in_words(trigger: dict, timezone: str) -> str:
    """A stored trigger (bot/scheduler/triggers.py) as a sentence: "every weekday at 8:00
    Vienna time", "once on 7 Dec 2026 at 09:00 Vienna time", "every 2 hours". Falls back
    to the crontab itself when its fields say more than these sentences can."""
    kind = trigger.get("kind") if isinstance(trigger, dict) else None
    where = f" {place(timezone)} time"
    if kind == "date":
        try:
            at = datetime.fromisoformat(str(trigger.get("at")))
        except ValueError:
            return f"once at {trigger.get('at')!s}"
        if at.tzinfo is not None:
            at = at.astimezone(zone_of(timezone))
        return f"once on {day_month(at)} {at.year} at {at.strftime('%H:%M')}{where}"
    if kind == "interval":
        try:
            seconds = float(trigger.get("seconds"))
        except (TypeError, ValueError):
            return f"every {trigger.get('seconds')!s} seconds"
        return "every " + _every(seconds)
    if kind == "cron":
        expr = str(trigger.get("expr", ""))
        said = cron_in_words(expr)
        return f"{said}{where}" if said else f"by the crontab “{expr}”{where}"
    return f"an unknown trigger {trigger!r}"


def _every(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return unit if n == 1 else f"{n} {unit}s"
    return f"{seconds:g} seconds"


def _number(field: str, low: int, high: int) -> int | None:
    return int(field) if field.isdigit() and low <= int(field) <= high else None


def _day_index(token: str) -> int | None:
    """A weekday of the crontab -> 0 for Monday .. 6. Numbers are cron's, 0 and 7 for
    Sunday, as the scheduler reads them (bot/scheduler/triggers.py `_cron_weekdays`)."""
    token = token.lower()
    if token in _DAY_ABBR:
        return _DAY_ABBR.index(token)
    if token.isdigit() and int(token) <= 7:
        return (int(token) - 1) % 7
    return None


def _weekdays(field: str) -> set[int] | None:
    """The days a crontab's weekday field names, or None if it is not a plain list of
    days and ranges."""
    days: set[int] = set()
    for part in field.split(","):
        first, dash, last = part.partition("-")
        a = _day_index(first)
        b = _day_index(last) if dash else a
        if a is None or b is None or b < a:
            return None
        days.update(range(a, b + 1))
    return days


def _days_in_words(days: set[int]) -> str:
    if days == set(range(7)):
        return "every day"
    if days == set(range(5)):
        return "every weekday"
    if days == {5, 6}:
        return "every weekend day"
    names = [DAY_NAMES[d] for d in sorted(days)]
    if len(names) == 1:
        return f"every {names[0]}"
    return "every " + ", ".join(names[:-1]) + " and " + names[-1]


def _times(minute: str, hour: str) -> str | None:
    m = _number(minute, 0, 59)
    if m is None:
        return None
    hours = [_number(h, 0, 23) for h in hour.split(",")]
    if not hours or None in hours:
        return None
    said = [f"{h}:{m:02d}" for h in hours]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]


def cron_in_words(expr: str) -> str | None:
    """The common crontabs in words (None for the rest): a time of day on some weekdays,
    on a day of the month or of the year, or every N minutes/hours."""
    fields = expr.split()
    if len(fields) != 5:
        return None
    minute, hour, dom, month, dow = fields
    if minute.startswith("*/") and hour == "*" and dom == month == dow == "*":
        n = _number(minute[2:], 1, 59)
        return None if n is None else "every " + ("minute" if n == 1 else f"{n} minutes")
    if hour.startswith("*/") and dom == month == dow == "*":
        n, m = _number(hour[2:], 1, 23), _number(minute, 0, 59)
        if n is None or m is None:
            return None
        return ("every hour" if n == 1 else f"every {n} hours") + f" at :{m:02d}"
    if hour == "*" and dom == month == dow == "*":
        m = _number(minute, 0, 59)
        return None if m is None else f"every hour at :{m:02d}"
    at = _times(minute, hour)
    if at is None:
        return None
    if dom == "*" and month == "*":
        days = _weekdays(dow) if dow != "*" else set(range(7))
        return None if days is None else f"{_days_in_words(days)} at {at}"
    day = _number(dom, 1, 31)
    if day is None or dow != "*":
        return None
    if month == "*":
        return f"on the {_ordinal(day)} of every month at {at}"
    mon = _number(month, 1, 12)
    if mon is None and month.lower() in _MONTH_ABBR:
        mon = _MONTH_ABBR.index(month.lower()) + 1
    return None if mon is None else f"every year on {day} {_MONTHS[mon - 1]} at {at}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


# -- tasks and approvals -----------------------------------------------------------------


def kind_in_words(kind: str, inputs) -> str:
    said = KINDS.get(kind, kind.replace("_", " "))
    if kind == "tool_call" and isinstance(inputs, dict):
        call = inputs.get("call") if isinstance(inputs.get("call"), dict) else inputs
        name = call.get("name") if isinstance(call, dict) else None
        if name:
            return f"{said}: {name}"
    return said


def state_in_words(state: str, stale: bool) -> str:
    return RESUMES if stale else STATE_WORDS.get(state, state)


def waiting_for(who: str | None, since: float, zone: ZoneInfo, now: float) -> str:
    """"waiting for Anna since 09:12" (a date too when it was not today)."""
    moment = datetime.fromtimestamp(since, UTC).astimezone(zone)
    today = datetime.fromtimestamp(now, UTC).astimezone(zone).date()
    when = moment.strftime("%H:%M")
    if moment.date() != today:
        when = f"{day_month(moment)} {when}"
    return f"waiting for {who or 'someone'} since {when}"


# -- money -------------------------------------------------------------------------------


def money(value: float, currency: str) -> str:
    """An amount with the digits that say something: 12.40 USD, 0.35 USD, 0.003 USD,
    0.00042 USD (never "0.00" for a cost that is not zero)."""
    return f"{amount(value)} {currency}"


def amount(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 0.1:
        return f"{value:.2f}"
    text = f"{value:.2g}"  # two significant digits below ten cents
    if "e" in text:
        text = f"{value:.{2 - int(f'{value:e}'.split('e')[1]) - 1}f}"
    return text
