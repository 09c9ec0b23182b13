"""Trigger maths with a controllable clock: DST changes, month ends, time zones."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from bot.scheduler.triggers import TriggerError, first_fire, latest_due, make_trigger, next_fire

VIENNA = "Europe/Vienna"


def at(*args, tz=VIENNA, fold=0):
    return datetime(*args, tzinfo=ZoneInfo(tz), fold=fold)


def fires(trigger, start, n):
    out, prev, now = [], None, start
    for _ in range(n):
        nxt = next_fire(trigger, now, previous=prev)
        out.append(nxt)
        prev = now = nxt
    return out


def test_daily_time_fires_once_when_clocks_go_back():
    trigger = make_trigger({"kind": "cron", "expr": "30 2 * * *"}, VIENNA)
    got = fires(trigger, at(2026, 10, 23, 12), 4)
    assert [(d.day, d.hour, d.minute) for d in got] == [
        (24, 2, 30), (25, 2, 30), (26, 2, 30), (27, 2, 30)]
    assert got[1].utcoffset() == timedelta(hours=2)  # the first 02:30 of the 25th only


def test_daily_time_in_the_skipped_hour_fires_once_when_clocks_go_forward():
    trigger = make_trigger({"kind": "cron", "expr": "30 2 * * *"}, VIENNA)
    got = fires(trigger, at(2026, 3, 27, 12), 4)
    assert [d.astimezone(ZoneInfo(VIENNA)).day for d in got] == [28, 29, 30, 31]
    # 02:30 does not exist on the 29th: it fires once, at 03:30 local (01:30 UTC)
    assert got[1].astimezone(UTC) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)


def test_hourly_interval_keeps_real_hours_across_dst():
    trigger = make_trigger({"kind": "interval", "seconds": 3600,
                            "start": "2026-10-25T00:00"}, VIENNA)
    got = fires(trigger, at(2026, 10, 25, 0, 30), 4)
    gaps = {(b - a).total_seconds() for a, b in zip(got, got[1:], strict=False)}
    assert gaps == {3600.0}


def test_month_ends():
    on_31st = make_trigger({"kind": "cron", "expr": "0 9 31 * *"}, VIENNA)
    assert [d.month for d in fires(on_31st, at(2026, 1, 1), 4)] == [1, 3, 5, 7]
    leap = make_trigger({"kind": "cron", "expr": "0 9 29 2 *"}, VIENNA)
    assert next_fire(leap, at(2026, 1, 1)).year == 2028


def test_same_wall_clock_in_different_zones_is_a_different_instant():
    tokyo = make_trigger({"kind": "cron", "expr": "0 9 * * *"}, "Asia/Tokyo")
    vienna = make_trigger({"kind": "cron", "expr": "0 9 * * *"}, VIENNA)
    start = datetime(2026, 12, 1, tzinfo=UTC)
    assert next_fire(tokyo, start).astimezone(UTC).hour == 0
    assert next_fire(vienna, start).astimezone(UTC).hour == 8


def test_weekly_cron_on_monday_mornings():
    trigger = make_trigger({"kind": "cron", "expr": "0 8 * * mon"}, VIENNA)
    got = fires(trigger, at(2026, 11, 30, 9), 2)  # a Monday, after 08:00
    assert [(d.strftime("%a"), d.day, d.hour) for d in got] == [("Mon", 7, 8), ("Mon", 14, 8)]


def test_one_off_fires_once():
    trigger = make_trigger({"kind": "date", "at": "2026-12-03T09:00"}, VIENNA)
    first = first_fire(trigger, at(2026, 11, 30))
    assert first == at(2026, 12, 3, 9)
    assert next_fire(trigger, first, previous=first) is None


def test_interval_first_fire_is_one_interval_after_creation():
    created = at(2026, 11, 30, 10)
    trigger = make_trigger({"kind": "interval", "seconds": 7200}, VIENNA, created=created)
    assert first_fire(trigger, created) == at(2026, 11, 30, 12)


def test_latest_missed_occurrence_and_count():
    trigger = make_trigger({"kind": "cron", "expr": "0 * * * *"}, VIENNA)
    latest, count = latest_due(trigger, at(2026, 11, 30, 1), at(2026, 11, 30, 5, 59))
    assert (latest, count) == (at(2026, 11, 30, 5), 5)


@pytest.mark.parametrize("spec, message", [
    ({"kind": "cron", "expr": "61 * * * *"}, "bad cron trigger"),
    ({"kind": "date", "at": "next thursday"}, "not an ISO date-time"),
    ({"kind": "interval", "seconds": 5}, "at least 60 seconds"),
    ({"kind": "weekly"}, "unknown trigger kind"),
    ({"kind": "cron"}, "needs 'expr'"),
])
def test_bad_specs_are_refused_with_a_reason(spec, message):
    with pytest.raises(TriggerError, match=message):
        make_trigger(spec, VIENNA)


@pytest.mark.parametrize(("field", "weekdays"), [
    ("1", {0}),  # Monday, as in cron (APScheduler 3 alone would read Tuesday)
    ("0", {6}), ("7", {6}),
    ("1-5", {0, 1, 2, 3, 4}),
    ("5-7", {4, 5, 6}),
    ("fri-sun", {4, 5, 6}),
    ("*/2", {6, 1, 3, 5}),  # Sunday, Tuesday, Thursday, Saturday
    ("1,3", {0, 2}),
    ("mon-fri", {0, 1, 2, 3, 4}),
])
def test_crontab_weekday_numbers_are_crons(field, weekdays):
    trigger = make_trigger({"kind": "cron", "expr": f"0 9 * * {field}"}, VIENNA)
    got = fires(trigger, at(2026, 3, 2), 14)
    assert {d.weekday() for d in got} == weekdays
    assert {d.hour for d in got} == {9}


@pytest.mark.parametrize("field", ["8", "5-2", "mon/0", "funday"])
def test_a_bad_crontab_weekday_is_a_trigger_error(field):
    with pytest.raises(TriggerError):
        make_trigger({"kind": "cron", "expr": f"0 9 * * {field}"}, VIENNA)
