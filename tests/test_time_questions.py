"""Time and people in questions: "yesterday", "last week", "in March" weigh what was said
then (in the asker's timezone), a named speaker weighs what that person said, and every
hit shows its date. Search tests run on SQLite and PostgreSQL."""

from datetime import datetime
from zoneinfo import ZoneInfo

import httpx

from bot.memory.search import remember, search_history
from bot.memory.when import parse_when
from bot.tools import ToolContext
from store import Writes, new_id

UTC = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
DAY = 86400.0


def ts(s: str, zone=UTC) -> float:
    return datetime.fromisoformat(s).replace(tzinfo=zone).timestamp()


def span(text, now, zone=UTC):
    w = parse_when(text, now=now, zone=zone)
    if w is None:
        return None
    return (datetime.fromtimestamp(w.since, zone).strftime("%Y-%m-%d"),
            datetime.fromtimestamp(w.until, zone).strftime("%Y-%m-%d"))


def test_time_phrases_are_calendar_stretches():
    now = ts("2024-06-12T10:00:00")  # a Wednesday
    assert span("what did Anna tell me yesterday?", now) == ("2024-06-11", "2024-06-12")
    assert span("what happened last week", now) == ("2024-06-03", "2024-06-10")
    assert span("this week", now) == ("2024-06-10", "2024-06-13")
    assert span("last month", now) == ("2024-05-01", "2024-06-01")
    assert span("last spring", now) == ("2024-03-01", "2024-06-01")
    assert span("last summer", now) == ("2023-06-01", "2023-09-01")  # this one is not over
    assert span("last winter", now) == ("2023-12-01", "2024-03-01")
    assert span("in May 2023", now) == ("2023-05-01", "2023-06-01")
    assert span("where is Dev going in May?", now) == ("2024-05-01", "2024-06-01")
    assert span("what did we do in July?", now) == ("2023-07-01", "2023-08-01")  # latest begun
    assert span("two weeks ago", now) == ("2024-05-25", "2024-06-03")
    assert span("since 2022", now) == ("2022-01-01", "2024-06-13")
    assert span("this may be wrong", now) is None and span("on Saturday", now) is None
    w = parse_when("What did Anna say about the car last week?", now=now, zone=UTC)
    assert w.relative and w.rest("What did Anna say about the car last week?") == \
        "What did Anna say about the car  ?"
    month = parse_when("trip in May", now=now, zone=UTC)
    assert not month.relative and month.rest("trip in May") == "trip in May"  # a word too


def test_yesterday_is_the_askers_yesterday():
    # 00:30 in Berlin on the 12th is still the 11th in UTC
    now = ts("2024-06-12T00:30:00", BERLIN)
    assert span("yesterday", now, BERLIN) == ("2024-06-11", "2024-06-12")
    assert span("yesterday", now, UTC) == ("2024-06-10", "2024-06-11")
    w = parse_when("yesterday", now=now, zone=BERLIN)
    assert w.since == ts("2024-06-11T00:00:00", BERLIN)


async def said(store, key, rows, *, owner="me", scope=None):
    conv = await store.ensure_conversation(key, owner=owner, scope=scope)
    w = Writes()
    for author, body, at in rows:
        w.append(conv.id, "user", body, author=author, created_at=at)
    await store.commit(w)
    return conv


async def texts(store, query, *, at, zone=UTC, **kw):
    return [h.entry.text for h in await remember(store, query, at=at, zone=zone, context=0,
                                                 **kw)]


async def test_the_questions_time_picks_which_of_two_alike_was_meant(store):
    march, may = ts("2024-03-14T19:00:00"), ts("2024-05-20T19:00:00")
    await said(store, "cli:anna", [
        ("Anna", "we had dinner at Casa Nova on Friday, totally worth it", march),
        ("Anna", "we had dinner at the Blue Fig on Friday, totally worth it", may),
        ("Bob", "quick update on the car: they want another form signed", march + DAY),
        ("Bob", "quick update on the car: it is finally sorted", may + DAY)])
    now = ts("2024-06-02T09:00:00")
    assert (await texts(store, "Where did Anna have dinner in March?", at=now))[0] == \
        "we had dinner at Casa Nova on Friday, totally worth it"
    # without the time, the newer one comes first
    assert (await texts(store, "Where did Anna have dinner?", at=now))[0] == \
        "we had dinner at the Blue Fig on Friday, totally worth it"
    yesterday = march + 2 * DAY
    assert (await texts(store, "what did Bob say about the car yesterday?", at=yesterday))[0] \
        == "quick update on the car: they want another form signed"
    # and in the asker's zone: 01:00 in Tokyo on March 17th is still the 16th in UTC
    tokyo = ZoneInfo("Asia/Tokyo")
    at = ts("2024-03-17T01:00:00", tokyo)
    assert (await texts(store, "the car yesterday", at=at, zone=tokyo))[0] == \
        "quick update on the car: they want another form signed"


async def test_a_question_of_time_and_people_only_finds_what_was_said_then(store):
    day = ts("2024-04-10T12:00:00")
    await said(store, "cli:chat", [
        ("Anna", "the plumber comes at eight", day - 30 * DAY),
        ("Anna", "I am off to the coast for the weekend", day),
        ("Bob", "have fun and send pictures", day + 60),
        ("Anna", "back home, sunburnt", day + 5 * DAY)])
    found = await texts(store, "What did Anna tell me yesterday?", at=day + DAY)
    assert found[0] == "I am off to the coast for the weekend"  # no word of it in the question
    # then, but not Anna: after Anna's own words then (Bob's reply is read with them, so
    # it may come before what she said at other times)
    assert found.index("have fun and send pictures") in (2, 3)
    assert await texts(store, "yesterday?", at=day + DAY) == [
        "have fun and send pictures", "I am off to the coast for the weekend"]


async def test_a_named_speaker_weighs_what_they_said(store):
    t = ts("2024-02-01T12:00:00")
    await said(store, "cli:pets", [
        ("Anna", "we adopted a puppy from the shelter, we named her Biscuit", t),
        ("Bob", "my neighbour's puppy keeps escaping", t + 20 * DAY)])
    now = t + 30 * DAY
    assert (await texts(store, "What did Anna name the puppy?", at=now))[0].endswith("Biscuit")
    assert (await texts(store, "puppy", at=now))[0] == "my neighbour's puppy keeps escaping"


async def test_time_never_reaches_another_scope(store):
    day = ts("2024-04-10T12:00:00")
    await said(store, "slack:T:D-zoe", [("zoe", "my pin is 4711", day)], owner="zoe")
    await said(store, "cli:me", [("me", "lunch was great", day)])
    found = await texts(store, "what was said yesterday?", at=day + DAY,
                        scopes=["private:me"])
    assert found == ["lunch was great"]


async def test_the_tool_shows_each_hits_date_in_the_askers_zone(store):
    conv = await said(store, "cli:tool", [
        ("Anna", "I went to the climbing gym", ts("2024-03-09T23:30:00"))])
    async with httpx.AsyncClient() as http:
        ctx = ToolContext(store=store, task_id=new_id(), conversation_id=conv.id, http=http,
                          timezone="Europe/Berlin")
        out = (await search_history.run(ctx, {"query": "climbing"})).content
    assert "1. Sun 2024-03-10 00:30 CET · cli:tool · #1" in out.splitlines()


def test_weeks_and_parts_of_a_month():
    now = ts("2024-12-06T10:00:00")  # a Friday
    assert span("what happened the second week of November?", now) == (
        "2024-11-08", "2024-11-15")
    assert span("the last week of October 2023", now) == ("2023-10-25", "2023-11-01")
    assert span("in the first week of december", now) == ("2024-12-01", "2024-12-08")
    assert span("late May 2023", now) == ("2023-05-20", "2023-06-01")
    assert span("at the beginning of March", now) == ("2024-03-01", "2024-03-11")
    assert span("in September, 2023", now) == ("2023-09-01", "2023-10-01")
    assert span("what did we do last weekend", now) == ("2024-11-30", "2024-12-02")
    assert parse_when("last weekend", now=now, zone=UTC).relative
    assert not parse_when("the second week of November", now=now, zone=UTC).relative


def test_days_before_and_after():
    now = ts("2024-12-06T10:00:00")  # a Friday
    assert span("what's on the day after tomorrow?", now) == ("2024-12-08", "2024-12-09")
    assert span("tomorrow", now) == ("2024-12-07", "2024-12-08")
    assert span("the day before yesterday", now) == ("2024-12-04", "2024-12-05")
    assert span("what did Anna do the day after May 3rd?", now) == ("2024-05-04", "2024-05-05")
    assert span("two days before 3 May 2023", now) == ("2023-05-01", "2023-05-02")
    assert span("3 days after 2024-02-27", now) == ("2024-03-01", "2024-03-02")  # leap year
    assert span("a week after March 10", now) == ("2024-03-14", "2024-03-21")  # the 17th ± 3
    assert span("the day after last weekend", now) == ("2024-12-02", "2024-12-03")  # Monday
    assert span("two days before the second week of November", now) == (
        "2024-11-06", "2024-11-07")
    assert span("on December 25", now) == ("2023-12-25", "2023-12-26")  # the latest begun
    # an event is no time phrase: the next one in the question counts, or none
    assert span("the day after the party", now) is None
    assert span("the day after the party last week", now) == ("2024-11-25", "2024-12-02")
    assert span("February 30", now) is None and span("we may 3d print it", now) is None
    w = parse_when("what did Bo say the day after yesterday?", now=now, zone=UTC)
    assert w.relative and w.phrase == "the day after yesterday"
    assert w.rest("what did Bo say the day after yesterday?") == "what did Bo say  ?"
    dated = parse_when("what did Bo say two days before May 3?", now=now, zone=UTC)
    assert not dated.relative and dated.phrase == "two days before May 3"


async def test_one_conversation_is_asked_about_in_its_own_time(store):
    """Searching one conversation (`steward search --session`), "last week" is the week
    before its newest message, not before today: an imported chat from 2023."""
    end = ts("2023-03-15T12:00:00")  # a Wednesday; the chat's last message
    chat = [("Bob", f"small talk {i}", end - 50 * DAY) for i in range(4)]  # apart: no
    await said(store, "slack:T:C-2023", [                              # neighbours
        ("Anna", "the kayak trip is an idea", end - 40 * DAY), *chat,
        ("Anna", "the kayak trip is booked", end - 8 * DAY), *chat,
        ("Anna", "the kayak trip was cancelled", end - DAY), *chat,
        ("Bob", "see you", end)])
    hits = await remember(store, "what about the kayak trip last week?",
                          conversation_key="slack:T:C-2023", context=0)
    assert hits[0].entry.text == "the kayak trip is booked"
    # across the store, "last week" is today's: nothing then, the newest comes first
    hits = await remember(store, "what about the kayak trip last week?", context=0)
    assert hits[0].entry.text == "the kayak trip was cancelled"
    hits = await remember(store, "what about the kayak trip in February 2023?",
                          conversation_key="slack:T:C-2023", context=0)
    assert hits[0].entry.text == "the kayak trip is an idea"
