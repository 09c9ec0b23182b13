"""Slack events that cannot be taken in: what `parse` refuses (a ts that is no Slack
timestamp, an id with odd characters, a number where text belongs), and what happens to
such an event and to one whose processing keeps failing: quarantined with the reason (seen
by `steward quarantine`), taken out of the journal, never in the way of the events behind
it. A failure that is Slack's outage is not the event's: it stays journaled for later."""

import asyncio
import copy
import json
import time

import pytest

from connectors.slack import web as slack_web
from connectors.slack.events import Identity, Malformed, parse
from tests.fakes.slack_events import body_of, edited, mention_of, mentions, says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import BOT_ID, BOT_USER, TEAM
from tests.test_slack_quarantine import pending_events

DM = "D0ALICE"
CHAN = "C0GENERAL"
ALICE = "U0ALICE"
ME = Identity(team=TEAM, user_id=BOT_USER, bot_id=BOT_ID)
FOREVER = 10**6


def dm_body(**event) -> dict:
    base = {"type": "message", "channel": DM, "channel_type": "im", "user": ALICE,
            "text": "hello", "ts": "1700000000.000100", "event_ts": "1700000000.000100"}
    return body_of({**base, **event}, eid="Ev0GOOD")


def test_a_well_formed_event_parses():
    ev = parse(dm_body(thread_ts="1699999999.000200"), ME)
    assert ev is not None
    assert (ev.kind, ev.channel, ev.user, ev.ts, ev.thread_ts) == (
        "message", DM, ALICE, "1700000000.000100", "1699999999.000200")
    assert ev.order == (1700000000, 100)


@pytest.mark.parametrize("change, field", [
    ({"ts": "notats"}, "ts"),
    ({"ts": ""}, "ts"),
    ({"ts": 1700000000.0001}, "ts"),
    ({"ts": "1700000000"}, "ts"),
    ({"ts": "1700000000.0001x"}, "ts"),
    ({"thread_ts": "soon"}, "thread_ts"),
    ({"channel": "D0A:LICE"}, "channel"),
    ({"channel": ""}, "channel"),
    ({"channel": ["D0ALICE"]}, "channel"),
    ({"user": "U0 ALICE"}, "user"),
    ({"user": 7}, "user"),
    ({"text": 42}, "text"),
    ({"files": "a file"}, "files"),
    ({"files": ["a file"]}, "files"),
    ({"channel_type": 3}, "channel_type"),
    ({"subtype": {"x": 1}}, "subtype"),
    ({"bot_id": 5}, "bot_id"),
])
def test_a_field_that_is_not_what_slack_sends_is_refused(change, field):
    with pytest.raises(Malformed, match=field):
        parse(dm_body(**change), ME)


@pytest.mark.parametrize("change, field", [
    ({"event_id": 12}, "event_id"),
    ({"team_id": "T0:FAKE"}, "team_id"),
    ({"event": "a string"}, "event"),
])
def test_an_envelope_that_is_not_what_slack_sends_is_refused(change, field):
    with pytest.raises(Malformed, match=field):
        parse({**dm_body(), **change}, ME)


def test_edits_and_deletions_are_checked_too(slack):
    top, _ = says(slack, DM, ALICE, "first")
    edit = edited(slack, DM, top["ts"], "second")
    assert parse(edit, ME) is not None
    broken = copy.deepcopy(edit)
    broken["event"]["message"]["edited"]["ts"] = "later"
    with pytest.raises(Malformed, match="edited"):
        parse(broken, ME)
    broken = copy.deepcopy(edit)
    broken["event"]["message"] = "gone"
    with pytest.raises(Malformed, match="message"):
        parse(broken, ME)
    deletion = body_of({"type": "message", "subtype": "message_deleted", "channel": DM,
                        "channel_type": "im", "ts": "1700000001.000100",
                        "deleted_ts": "yesterday",
                        "previous_message": {"user": ALICE, "text": "x", "ts": top["ts"]}})
    with pytest.raises(Malformed, match="deleted_ts"):
        parse(deletion, ME)


async def until(check, within: float = 20.0, what: str = "the condition"):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def quarantined(store) -> dict[str, dict]:
    return {q["external_id"]: q for q in await store.list_submissions(
        state="quarantined", channel="slack")}


def with_bad_ts(body: dict) -> dict:
    broken = copy.deepcopy(body)
    broken["event"]["ts"] = "notats"
    broken["event_id"] = body["event_id"] + "BAD"
    return broken


async def test_a_malformed_event_over_http_is_acked_quarantined_and_passed(store, tmp_path,
                                                                           slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        _, body = says(slack, DM, ALICE, "broken")
        bad = with_bad_ts(body)
        _, good = says(slack, DM, ALICE, "fine")
        assert (await rig.send(bad))[0] == 200  # acked: Slack must not send it again
        assert (await rig.send(good))[0] == 200
        await rig.settle()
        found = await until(lambda: quarantined(store), what="the quarantine")
        assert (await rig.send(bad, retry_num=1))[0] == 200  # Slack's retry: a no-op
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: fine"]
    assert list(found) == [bad["event_id"]]
    assert "ts" in found[bad["event_id"]]["reason"]
    assert json.loads(found[bad["event_id"]]["payload"])["event"]["ts"] == "notats"
    assert len(await quarantined(store)) == 1
    assert bad["event_id"] not in await pending_events(store, tmp_path)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_malformed_envelope_over_the_socket_is_acked_and_quarantined(store, tmp_path,
                                                                             slack):
    async with SlackRig(store, tmp_path, slack, mode="socket") as rig:
        await until(lambda: asyncio.sleep(0, slack.connected()), what="the socket")
        _, body = says(slack, DM, ALICE, "broken")
        envelope = slack.push(with_bad_ts(body))
        _, good = says(slack, DM, ALICE, "fine")
        second = slack.push(good)
        await until(lambda: asyncio.sleep(0, slack.acked(envelope) and slack.acked(second)),
                    what="both acks")
        await rig.settle()
        await until(lambda: quarantined(store), what="the quarantine")
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: fine"]


async def test_a_journal_line_that_cannot_be_taken_in_is_quarantined_at_start(store,
                                                                              tmp_path, slack):
    """What an older process journaled: start goes on, the events behind it are answered."""
    _, body = says(slack, DM, ALICE, "broken")
    bad = with_bad_ts(body)
    _, good = says(slack, DM, ALICE, "fine")
    not_an_event = {**copy.deepcopy(good), "event_id": "Ev0WEIRD", "event": [1, 2]}
    (tmp_path / "slack-inbox.jsonl").write_text("".join(
        json.dumps({"event": b}) + "\n" for b in (bad, not_an_event, good)))
    async with SlackRig(store, tmp_path, slack) as rig:
        await rig.settle()
        found = await until(lambda: quarantined(store), what="the quarantine")
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: fine"]
    assert set(found) == {bad["event_id"], "Ev0WEIRD"}
    assert await pending_events(store, tmp_path) == set()


class BrokenFiles:
    """Reading the attached files fails, every time: the event's own trouble."""

    async def describe(self, files, keep=None) -> tuple[str, list[dict]]:
        if files:
            raise ValueError("this file cannot be read")
        return "", []


async def test_an_event_whose_processing_keeps_failing_is_quarantined(store, tmp_path,
                                                                      slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        rig.connector.inbox.files = BrokenFiles()
        _, failing = says(slack, DM, ALICE, "see attached",
                          files=[{"id": "F1", "name": "a.txt", "mimetype": "text/plain"}])
        _, good = says(slack, DM, ALICE, "and this")
        assert (await rig.send(failing))[0] == 200
        assert (await rig.send(good))[0] == 200
        await rig.settle()
        found = await until(lambda: quarantined(store), what="the quarantine")
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: and this"]
    reason = found[failing["event_id"]]["reason"]
    assert "3 attempts" in reason and "this file cannot be read" in reason, reason
    assert await pending_events(store, tmp_path) == set()


async def test_a_slack_outage_while_processing_is_not_the_events_fault(store, tmp_path, slack,
                                                                       monkeypatch):
    """Entering a thread reads its history; Slack answers 503 until healed. The mention is
    left journaled, not quarantined, and the next start answers it."""
    monkeypatch.setattr(slack_web, "RETRY_BACKOFF", 0.01)
    monkeypatch.setattr(slack_web, "RETRY_JITTER", 0.01)
    root = slack.add_message(CHAN, {"user": ALICE, "text": "the boiler"})
    ask, _ = says(slack, CHAN, ALICE, mentions("what now?"), thread_ts=root["ts"])
    body = mention_of(ask, CHAN)
    slack.fail("conversations.replies", 503, times=FOREVER)
    async with SlackRig(store, tmp_path, slack) as rig:
        assert (await rig.send(body))[0] == 200
        await rig.settle()
    assert await quarantined(store) == {}
    assert await pending_events(store, tmp_path) == {body["event_id"]}
    assert slack.bot_messages(CHAN) == []

    slack.heal()
    async with SlackRig(store, tmp_path, slack) as rig:
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(CHAN)] == ["echo: what now?"]
    assert await pending_events(store, tmp_path) == set()
