"""Time in a question: "yesterday", "last week", "last spring", "in May 2023", "3 days
ago", "the day after May 3rd" as a stretch of time [since, until) in the asker's timezone,
so that the search can prefer what was said then (store/search.py: `window`).

Only the first time phrase of a question counts. Relative phrases ("yesterday", "last
week", "two months ago") are taken out of the words looked up: they say when, not what.
A month or a year ("in May", "2023") stays a word too, since it may be what was said ("we
booked flights for May"). A bare weekday is no time phrase ("on Saturday" in a question is
as often the day of the fact as the day it was told), nor is "may" in lower case without
a year or "in" before it (the verb).

Seasons are the meteorological ones of the northern hemisphere (spring March to May,
summer June to August, autumn September to November, winter December to February).
"last X" is the latest X that is over (in spring, "last spring" is a year ago); "this X"
the one of this year; "in X" the latest one that has begun. A month without a year is
the latest that has begun. "The second week of November" is its days 8-14 ("the last
week": its last seven), "early/mid/late May" its days 1-10, 10-20 and 20 to the end;
"last weekend" the latest Saturday and Sunday that are over. A date ("May 3rd", "3 May
2024", "2024-05-03") is that day, without a year the latest that has begun; "tomorrow" and
"the day after tomorrow" are days ahead (a question may ask what was planned for them).
"The day after X", "two days before X", "a week after X" shift any of these phrases X (a
week by three days' slack each side); X may not be an event ("the day after the party"
names no time this parser can know), and the shifted phrase is relative when X is.
"""

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo

__all__ = ["When", "parse_when"]

MONTHS = {name: i + 1 for i, names in enumerate((
    "january jan", "february feb", "march mar", "april apr", "may", "june jun", "july jul",
    "august aug", "september sep sept", "october oct", "november nov", "december dec"))
    for name in names.split()}
SEASONS = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}  # first month
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
           "seven": 7, "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "a few": 3,
           "couple of": 2, "few": 3, "several": 4}
RECENT_DAYS = 30  # "recently", "lately"

_NUM = r"(\d{1,3}|a couple of|couple of|a few|few|several|an?|one|two|three|four|five|six|" \
       r"seven|eight|nine|ten)"
_UNIT = r"(day|week|month|year)s?"
_MONTH = "|".join(sorted(MONTHS, key=len, reverse=True))
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?:,? ((?:19|20)\d\d))?"
_PATTERNS = [  # (name, pattern); first match in the text wins, then the earliest pattern
    ("day_before", r"\bthe day before yesterday\b"),
    ("day_after", r"\bthe day after tomorrow\b"),
    ("offset", rf"\b(?:the )?(?:(day)|(?:{_NUM} (day|week)s?)) (after|before) "),
    ("yesterday", r"\byesterday\b"),
    ("tomorrow", r"\btomorrow\b"),
    ("iso_date", r"\b((?:19|20)\d\d)-(\d\d)-(\d\d)\b"),
    ("date", rf"\b(?:on )?(?:({_MONTH})\.? {_DAY}|{_DAY} (?:of )?({_MONTH})\.?){_YEAR}\b"),
    ("last_night", r"\blast night\b"),
    ("today", r"\b(today|this morning|this afternoon|this evening|tonight)\b"),
    ("ago", rf"\b{_NUM} {_UNIT} ago\b"),
    ("past", rf"\b(?:in |over |during )?the (?:past|last) {_NUM} {_UNIT}\b"),
    ("past_one", rf"\b(?:in |over |during )?the past {_UNIT}\b"),
    ("rel_season", r"\b(last|this|previous) (spring|summer|autumn|fall|winter)\b"),
    ("rel_unit", r"\b(last|this|previous) (week|month|year)\b"),
    ("nth_week", rf"\b(?:in |during )?the (first|1st|second|2nd|third|3rd|fourth|4th|last) "
                 rf"week of ({_MONTH})\.?,?(?: ((?:19|20)\d\d))?\b"),
    ("part_month", rf"\b(early|mid|late|the (?:beginning|start|middle|end) of) ({_MONTH})"
                   rf"\.?,?(?: ((?:19|20)\d\d))?\b"),
    ("weekend", r"\b(last|this|the|previous) weekend\b"),
    ("month_year", rf"\b(?:in |during |since )?({_MONTH})\.?,? (?:of )?((?:19|20)\d\d)\b"),
    ("rel_month", rf"\b(last|this) ({_MONTH})\b"),
    ("in_month", rf"\b(in|during|since) ({_MONTH})\b"),
    ("in_season", r"\b(?:in|during) (?:the )?(spring|summer|autumn|fall|winter)\b"),
    ("year", r"\b(?:in|during|since) ((?:19|20)\d\d)\b"),
    ("recent", r"\b(recently|lately|these days)\b"),
]
_RELATIVE = {"day_before", "day_after", "tomorrow", "yesterday", "last_night", "today", "ago",
             "past", "past_one", "rel_season", "rel_unit", "rel_month", "in_season", "recent",
             "weekend"}
_NTH = {"first": 0, "1st": 0, "second": 1, "2nd": 1, "third": 2, "3rd": 2, "fourth": 3,
        "4th": 3}
_PART = {"early": (1, 11), "mid": (10, 21), "late": (20, 32), "the beginning of": (1, 11),
         "the start of": (1, 11), "the middle of": (10, 21), "the end of": (20, 32)}
_COMPILED = [(name, re.compile(p, re.IGNORECASE)) for name, p in _PATTERNS]


@dataclass(frozen=True)
class When:
    """A stretch of time a question is about: unix seconds, `until` exclusive."""

    since: float
    until: float
    phrase: str  # the words that said it, as written
    start: int  # where they are in the question
    end: int
    relative: bool  # said relative to now: not a word to look up

    def rest(self, text: str) -> str:
        """The question without a relative time phrase (a month or year stays)."""
        if not self.relative:
            return text
        return (text[:self.start] + " " + text[self.end:]).strip()


def _midnight(d: date, zone: tzinfo) -> float:
    return datetime(d.year, d.month, d.day, tzinfo=zone).timestamp()


def _month_start(year: int, month: int) -> date:
    while month > 12:
        year, month = year + 1, month - 12
    while month < 1:
        year, month = year - 1, month + 12
    return date(year, month, 1)


def _latest_month(today: date, month: int, year: str | None) -> date:
    """The 1st of `month` in `year`, or without one the latest that has begun."""
    if year:
        return date(int(year), month, 1)
    start = _month_start(today.year, month)
    return start if start <= today else _month_start(today.year - 1, month)


def _number(word: str) -> int:
    word = word.lower()
    return int(word) if word.isdigit() else NUMBERS[word]


def _season(today: date, first_month: int, which: str) -> tuple[date, date]:
    """[start, end) of the season that starts in `first_month`: the latest one that has
    begun ("in", "this") or is over ("last")."""
    year = today.year
    start = _month_start(year, first_month)
    if first_month == 12 and today.month < 12:
        start = _month_start(year - 1, 12)  # winter began last December
    if start > today:
        start = _month_start(start.year - 1, first_month)
    end = _month_start(start.year, start.month + 3)
    if which in ("last", "previous") and end > today:
        start, end = _month_start(start.year - 1, first_month), _month_start(
            start.year - 1, first_month + 3)
    return start, end


def _span(name: str, m: re.Match, today: date) -> tuple[date, date] | None:
    """[first day, day after the last) of a match, by the calendar of `today`."""
    g = m.groups()
    tomorrow = today + timedelta(days=1)
    if name == "day_before":
        return today - timedelta(days=2), today - timedelta(days=1)
    if name == "day_after":
        return today + timedelta(days=2), today + timedelta(days=3)
    if name == "yesterday":
        return today - timedelta(days=1), today
    if name == "tomorrow":
        return tomorrow, tomorrow + timedelta(days=1)
    if name in ("date", "iso_date"):
        return _date(g, today)
    if name == "last_night":
        return today - timedelta(days=1), tomorrow
    if name == "today":
        return today, tomorrow
    if name == "ago":  # around that day, week, month or year
        n, unit = _number(g[0]), g[1].lower()
        at = {"day": timedelta(days=n), "week": timedelta(weeks=n),
              "month": timedelta(days=30 * n), "year": timedelta(days=365 * n)}[unit]
        slack = {"day": 1, "week": 4, "month": 15, "year": 120}[unit]
        centre = today - at
        return centre - timedelta(days=slack), centre + timedelta(days=slack + 1)
    if name in ("past", "past_one"):
        n, unit = (_number(g[0]), g[1].lower()) if name == "past" else (1, g[0].lower())
        days = {"day": 1, "week": 7, "month": 30, "year": 365}[unit] * n
        return today - timedelta(days=days), tomorrow
    if name == "rel_unit":
        which, unit = g[0].lower(), g[1].lower()
        if unit == "week":
            monday = today - timedelta(days=today.weekday())
            return (monday, tomorrow) if which == "this" else (monday - timedelta(weeks=1),
                                                                monday)
        if unit == "month":
            first = today.replace(day=1)
            return (first, tomorrow) if which == "this" else (_month_start(
                today.year, today.month - 1), first)
        first = date(today.year, 1, 1)
        return (first, tomorrow) if which == "this" else (date(today.year - 1, 1, 1), first)
    if name in ("rel_season", "in_season"):
        which, season = (g[0].lower(), g[1].lower()) if name == "rel_season" else ("in",
                                                                                  g[0].lower())
        return _season(today, SEASONS[season], which)
    if name == "month_year":
        month, year = MONTHS[g[0].lower().rstrip(".")], int(g[1])
        return _month_start(year, month), _month_start(year, month + 1)
    if name in ("nth_week", "part_month"):
        first = _latest_month(today, MONTHS[g[1].lower()], g[2])
        after = _month_start(first.year, first.month + 1)
        if name == "part_month":
            lo, hi = _PART[" ".join(g[0].lower().split())]
            return first.replace(day=lo), min(after, first + timedelta(days=hi - 1))
        if g[0].lower() == "last":
            return after - timedelta(days=7), after
        start = first + timedelta(weeks=_NTH[g[0].lower()])
        return start, min(after, start + timedelta(days=7))
    if name == "weekend":  # the latest Saturday and Sunday that have begun (or are over)
        saturday = today - timedelta(days=(today.weekday() - 5) % 7)
        if g[0].lower() in ("last", "previous") and saturday + timedelta(days=2) > today:
            saturday -= timedelta(weeks=1)
        return saturday, saturday + timedelta(days=2)
    if name in ("rel_month", "in_month"):
        which, word = g[0].lower(), g[1]
        if word.lower() == "may" and which == "this" and not word[0].isupper():
            return None  # "this may be": the verb
        month = MONTHS[word.lower()]
        start = _month_start(today.year, month)
        if start > today or (which == "last" and month == today.month):
            start = _month_start(today.year - 1, month)
        return start, _month_start(start.year, start.month + 1)
    if name == "year":
        year = int(g[0])
        return date(year, 1, 1), date(year + 1, 1, 1)
    if name == "recent":
        return today - timedelta(days=RECENT_DAYS), tomorrow
    return None


def _date(g: tuple, today: date) -> tuple[date, date] | None:
    """One day: "May 3rd", "3 May 2024", "2024-05-03"; without a year the latest that has
    begun. None for no such day, or "may 3" in lower case without a year (the verb)."""
    if len(g) == 3:  # ISO
        year, month, day = int(g[0]), int(g[1]), int(g[2])
    else:
        word = g[0] or g[3]
        if word == "may" and not g[4]:
            return None
        month, day = MONTHS[word.lower()], int(g[1] or g[2])
        year = int(g[4]) if g[4] else today.year
    try:
        d = date(year, month, day)
        if len(g) == 5 and not g[4] and d > today:
            d = date(year - 1, month, day)
    except ValueError:  # "February 30", or February 29 of a year without it
        return None
    return d, d + timedelta(days=1)


def _offset(m: re.Match, text: str, today: date) -> tuple[date, date, int, bool] | None:
    """"The day after X", "two days before X", "a week after X": the day that far from the
    time phrase X right after it (after: from X's last day; before: from its first), a
    week's with three days' slack each side. (first day, day after the last, where X ends,
    whether X was relative.) None when X is no time phrase ("the day after the party")."""
    for name, pattern in _COMPILED:
        if name == "offset":
            continue
        x = pattern.match(text, m.end())
        span = _span(name, x, today) if x else None
        if span is None:
            continue
        n = 1 if m.group(1) else _number(m.group(2))
        days = n * (7 if (m.group(3) or "day").lower() == "week" else 1)
        at = (span[1] + timedelta(days=days - 1) if m.group(4).lower() == "after"
              else span[0] - timedelta(days=days))
        slack = 3 if days >= 7 else 0
        return (at - timedelta(days=slack), at + timedelta(days=slack + 1), x.end(),
                name in _RELATIVE)
    return None


def parse_when(text: str, *, now: float, zone: tzinfo) -> When | None:
    """The first time phrase in `text`, as a stretch of time in `zone` seen from `now`."""
    today = datetime.fromtimestamp(now, zone).date()
    found = sorted(((m.start(), i, name, m) for i, (name, pattern) in enumerate(_COMPILED)
                    for m in pattern.finditer(text)), key=lambda f: (f[0], f[1]))
    for _, _, name, m in found:
        end, relative = m.end(), name in _RELATIVE
        if name == "offset":
            shifted = _offset(m, text, today)
            if shifted is None:
                continue
            first, after, end, relative = shifted
        else:
            span = _span(name, m, today)
            if span is None:
                continue
            first, after = span
        if m.group(0).lower().startswith("since"):
            after = today + timedelta(days=1)
        return When(_midnight(first, zone), _midnight(after, zone), text[m.start():end],
                    m.start(), end, relative)
    return None
