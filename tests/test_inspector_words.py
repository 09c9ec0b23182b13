"""The inspector's words (bot/app/inspector/words.py): each trigger kind the scheduler
stores, said as a person says it, and checked against the scheduler's own trigger maths
(a sentence that disagrees with when the reminder really fires would be worse than the
crontab); task states, ages, approvals and money."""

import os
import socket
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from bot.app.inspector.words import (
    RESUMES,
    ago,
    amount,
    cron_in_words,
    kind_in_words,
    moment_in_words,
    money,
    state_in_words,
    trigger_in_words,
    waiting_for,
)
from bot.app.lease_holder import holder_alive
from bot.scheduler.triggers import make_trigger, next_fire
from store import Task

VIENNA = ZoneInfo("Europe/Vienna")


def fires(spec: dict, zone: str, n: int, start: datetime) -> list[datetime]:
    trigger = make_trigger(spec, zone, created=start)
    out, after = [], start
    for _ in range(n):
        after = next_fire(trigger, after, previous=out[-1] if out else None)
        out.append(after)
    return out


@pytest.mark.parametrize(("expr", "said", "weekdays", "hour"), [
    ("0 8 * * mon-fri", "every weekday at 8:00", {0, 1, 2, 3, 4}, 8),
    # Numbers as cron has them (0 and 7 are Sunday), however APScheduler 3 counts.
    ("0 8 * * 1-5", "every weekday at 8:00", {0, 1, 2, 3, 4}, 8),
    ("30 7 * * *", "every day at 7:30", set(range(7)), 7),
    ("0 9 * * mon", "every Monday at 9:00", {0}, 9),
    ("0 9 * * 1", "every Monday at 9:00", {0}, 9),
    ("0 10 * * sat,sun", "every weekend day at 10:00", {5, 6}, 10),
    ("0 10 * * 6,0", "every weekend day at 10:00", {5, 6}, 10),
    ("15 18 * * 0", "every Sunday at 18:15", {6}, 18),
    ("15 18 * * 7", "every Sunday at 18:15", {6}, 18),
    ("0 12 * * mon,wed,fri", "every Monday, Wednesday and Friday at 12:00", {0, 2, 4}, 12),
])
def test_a_weekly_crontab_in_words_says_when_it_fires(expr, said, weekdays, hour):
    assert trigger_in_words({"kind": "cron", "expr": expr}, "Europe/Vienna") == \
        f"{said} Vienna time"
    times = fires({"kind": "cron", "expr": expr}, "Europe/Vienna", 14,
                  datetime(2026, 3, 2, tzinfo=VIENNA))
    assert {t.weekday() for t in times} == weekdays
    assert {t.hour for t in times} == {hour}


def test_other_crontabs_in_words_and_the_rest_as_they_are():
    assert cron_in_words("*/15 * * * *") == "every 15 minutes"
    assert cron_in_words("0 */2 * * *") == "every 2 hours at :00"
    assert cron_in_words("5 * * * *") == "every hour at :05"
    assert cron_in_words("0 8,17 * * mon-fri") == "every weekday at 8:00 and 17:00"
    assert cron_in_words("0 9 1 * *") == "on the 1st of every month at 9:00"
    assert cron_in_words("0 9 24 12 *") == "every year on 24 Dec at 9:00"
    for odd in ("0 9 1-7 * mon", "0 9-17/2 * * *", "*/7 9 * * *", "0 9 * *"):
        assert cron_in_words(odd) is None, odd
    said = trigger_in_words({"kind": "cron", "expr": "0 9-17/2 * * *"}, "UTC")
    assert said == "by the crontab “0 9-17/2 * * *” UTC time"
    times = fires({"kind": "cron", "expr": "0 9 1 * *"}, "UTC", 3,
                  datetime(2026, 3, 2, tzinfo=ZoneInfo("UTC")))
    assert [(t.day, t.hour) for t in times] == [(1, 9)] * 3


def test_once_and_every_in_words():
    assert trigger_in_words({"kind": "date", "at": "2026-12-07T09:00"}, "Europe/Vienna") == \
        "once on 7 Dec 2026 at 09:00 Vienna time"
    # An offset given with the time is said in the schedule's zone.
    assert trigger_in_words({"kind": "date", "at": "2026-12-07T08:00+00:00"},
                            "Europe/Vienna") == "once on 7 Dec 2026 at 09:00 Vienna time"
    assert trigger_in_words({"kind": "interval", "seconds": 7200}, "UTC") == "every 2 hours"
    assert trigger_in_words({"kind": "interval", "seconds": 60}, "UTC") == "every minute"
    assert trigger_in_words({"kind": "interval", "seconds": 86400}, "UTC") == "every day"
    assert trigger_in_words({"kind": "interval", "seconds": 5400}, "UTC") == \
        "every 90 minutes"
    assert trigger_in_words({"kind": "sometimes"}, "UTC").startswith("an unknown trigger")
    assert trigger_in_words({"kind": "date", "at": "soon"}, "UTC") == "once at soon"


def test_a_running_task_whose_lease_ran_out_is_interrupted_and_will_resume():
    now = 1_000_000.0

    def task(state: str, lease_expires: float) -> Task:
        return Task(id="t", kind="turn", parent_id=None, conversation_id=1, state=state,
                    phase="", inputs={}, checkpoint={}, result=None, error=None,
                    idem_key=None, dedupe_key=None, attempts=0, wait_mode=None,
                    lease_owner="h:1:x", lease_expires=lease_expires, run_after=0.0,
                    created_at=now, updated_at=now)

    assert task("running", now - 1).stalled(now)
    assert not task("running", now + 10).stalled(now)
    # The lease not yet out, but its process gone (a double Ctrl-C): stalled too.
    assert task("running", now + 10).stalled(now, alive=lambda owner: False)
    assert not task("running", now + 10).stalled(now, alive=lambda owner: None)
    assert not task("done", now - 1).stalled(now)
    # a process of this machine that is gone, and one that lives
    assert holder_alive(f"{socket.gethostname()}:{2**22 + 12345}:x") is False
    assert holder_alive(f"{socket.gethostname()}:{os.getpid()}:x") is True
    assert holder_alive("elsewhere:1:x") is None
    assert state_in_words("running", True) == RESUMES == "interrupted — will resume"
    assert state_in_words("running", False) == "running"
    assert state_in_words("pending", False) == "waiting its turn"


def test_kinds_ages_and_moments_in_words():
    assert kind_in_words("llm_call", {}) == "model call"
    assert kind_in_words("tool_call", {"call": {"name": "todo", "arguments": {}}}) == \
        "tool call: todo"
    assert kind_in_words("something_new", None) == "something new"
    assert ago(10) == "just now"
    assert ago(5 * 60) == "5 min ago"
    assert ago(3 * 3600) == "3 h ago"
    assert ago(90 * 60) == "1.5 h ago"
    assert ago(5 * 86400) == "5 days ago"
    assert ago(3599.6) == "1 h ago" and ago(59.6) == "1 min ago"  # never "60 min"
    now = datetime(2026, 3, 4, 12, 0, tzinfo=VIENNA).timestamp()
    at = datetime(2026, 3, 4, 9, 12, tzinfo=VIENNA).timestamp()
    assert moment_in_words(at, VIENNA, now) == "today 09:12"
    assert moment_in_words(at - 86400, VIENNA, now) == "yesterday 09:12"
    assert moment_in_words(at - 7 * 86400, VIENNA, now) == "Wed 25 Feb 09:12"
    assert moment_in_words(at - 400 * 86400, VIENNA, now) == "Tue 28 Jan 2025 09:12"


def test_an_approval_waits_for_a_person_since_a_time():
    now = datetime(2026, 3, 4, 12, 0, tzinfo=VIENNA).timestamp()
    since = datetime(2026, 3, 4, 9, 12, tzinfo=VIENNA).timestamp()
    assert waiting_for("Anna", since, VIENNA, now) == "waiting for Anna since 09:12"
    assert waiting_for("Anna", since - 86400, VIENNA, now) == \
        "waiting for Anna since 3 Mar 09:12"


def test_money_never_reads_zero_for_a_cost():
    assert money(12.4, "USD") == "12.40 USD"
    assert amount(0.35) == "0.35"
    assert amount(0.003) == "0.003"
    assert amount(0.00042) == "0.00042"
    assert amount(0.0123) == "0.012"
    assert amount(0.00001) == "0.000010"
    assert amount(0) == "0"
