"""The Events API (HTTP mode) against a running connector: signed requests, Slack's
retries, a replay hours later, forged and stale signatures; DMs answered once."""

import hashlib
import hmac
import json
import logging
import time

import pytest

from tests.fakes.slack_events import SIGNING_SECRET, deliver, says, signed_headers
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import BOT_ID

DM = "D0ALICE"
ALICE = "U0ALICE"


async def test_a_dm_is_answered_once_in_the_dm(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        _, body = says(slack, DM, ALICE, "hello **there**")
        status, _ = await rig.send(body)
        assert status == 200
        await rig.settle()
    answers = slack.bot_messages(DM)
    assert [m["text"] for m in answers] == ["echo: hello *there*"]  # Markdown -> mrkdwn
    assert answers[0].get("thread_ts") is None  # a DM is answered in the DM itself
    assert answers[0]["metadata"]["event_payload"]["key"].endswith(".answer")
    conv = await store.get_conversation(f"slack:T0FAKE:{DM}")
    entries = await store.entries_page(conv.id, limit=10)
    assert [(e.kind, e.author) for e in entries] == [("user", "Alice"), ("assistant", None)]
    assert slack.count("reactions.add", ok_only=True) == 1
    assert slack.count("reactions.remove", ok_only=True) == 1


async def test_retries_and_a_replay_hours_later_are_no_ops(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        _, body = says(slack, DM, ALICE, "only once please")
        assert (await rig.send(body))[0] == 200
        for n in (1, 2, 3):  # Slack's retries carry the same event id
            assert (await rig.send(body, retry_num=n))[0] == 200
        await rig.settle()
        # hours later: the same event, freshly and validly signed
        assert (await rig.send(body, timestamp=int(time.time())))[0] == 200
        await rig.settle()
    assert len(slack.bot_messages(DM)) == 1
    conv = await store.get_conversation(f"slack:T0FAKE:{DM}")
    assert [e.kind for e in await store.entries_page(conv.id)] == ["user", "assistant"]


async def test_forged_and_stale_signatures_get_401_and_nothing_is_stored(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        _, body = says(slack, DM, ALICE, "let me in")
        forged, _ = await deliver(rig.http, rig.events_url, body, secret="not-the-secret")
        stale, _ = await deliver(rig.http, rig.events_url, body,
                                 timestamp=int(time.time()) - 6 * 60)
        assert (forged, stale) == (401, 401)
        unsigned = await rig.http.post(rig.events_url, json=body)
        assert unsigned.status_code == 401
        await rig.settle()
    assert await store.list_conversations() == []
    assert slack.bot_messages(DM) == []
    assert not (tmp_path / "slack-inbox.jsonl").exists() or \
        (tmp_path / "slack-inbox.jsonl").read_text() == ""


async def test_url_verification_is_answered(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        raw = json.dumps({"type": "url_verification", "challenge": "abc123", "token": "x"})
        response = await rig.http.post(rig.events_url, content=raw, headers=signed_headers(raw))
        assert response.status_code == 200
        assert response.json() == {"challenge": "abc123"}


async def test_own_messages_and_other_bots_are_ignored(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        _, own = says(slack, DM, "U0STEWARD", "my own words", bot_id=BOT_ID)
        _, other = says(slack, DM, "U0OTHERBOT", "beep", bot_id="B0OTHER")
        for body in (own, other):
            assert (await rig.send(body))[0] == 200
        await rig.settle()
    assert await store.list_conversations() == []
    assert len(slack.bot_messages(DM)) == 1  # only the one "own" message the test put there


@pytest.mark.parametrize("timestamp", ["notanumber", "", "12.5", "-60", "1e9", "0x10",
                                       "9" * 5000, None])
async def test_a_bad_signature_timestamp_is_refused_without_a_traceback(
        store, tmp_path, slack, caplog, timestamp):
    """A timestamp header that is no number of seconds (or none at all) is a refused
    request, like a forged signature: a 401, nothing logged as an error, nothing stored."""
    async with SlackRig(store, tmp_path, slack) as rig:
        _, body = says(slack, DM, ALICE, "hello")
        raw = json.dumps(body)
        headers = signed_headers(raw)
        if timestamp is None:
            del headers["X-Slack-Request-Timestamp"]
        else:
            headers["X-Slack-Request-Timestamp"] = timestamp
        response = await rig.http.post(rig.events_url, content=raw, headers=headers)
        assert response.status_code in (400, 401), response.text
        unsigned = {k: v for k, v in signed_headers(raw).items() if k != "X-Slack-Signature"}
        response = await rig.http.post(rig.events_url, content=raw, headers=unsigned)
        assert response.status_code == 401
        await rig.settle()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage() for r in caplog.records]
    assert await store.list_conversations() == []
    assert slack.bot_messages(DM) == []


async def test_a_body_that_is_not_utf8_is_refused_without_a_traceback(store, tmp_path, slack,
                                                                       caplog):
    async with SlackRig(store, tmp_path, slack) as rig:
        raw = b'{"type": "event_callback", "text": "\xff\xfe"}'
        ts = str(int(time.time()))
        digest = hmac.new(SIGNING_SECRET.encode(), f"v0:{ts}:".encode() + raw,
                          hashlib.sha256).hexdigest()
        response = await rig.http.post(rig.events_url, content=raw, headers={
            "X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}",
            "Content-Type": "application/json"})
        assert response.status_code == 400, response.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("raw, content_type", [
    ("[1]", "application/json"),
    ("5", "application/json"),
    ("{not json", "application/json"),
    ('{"type": "event_callback", "event_id": "Ev1", "event": 5}', "application/json"),
    ("payload=%7Bnot+json", "application/x-www-form-urlencoded"),
])
async def test_a_signed_body_that_is_no_slack_payload_gets_400_without_a_traceback(
        store, tmp_path, slack, caplog, raw, content_type):
    async with SlackRig(store, tmp_path, slack) as rig:
        headers = {**signed_headers(raw), "Content-Type": content_type}
        response = await rig.http.post(rig.events_url, content=raw, headers=headers)
        assert response.status_code == 400, response.text
        unsigned = await rig.http.post(rig.events_url, content=raw, headers={
            **headers, "X-Slack-Signature": "v0=" + "0" * 64})
        assert unsigned.status_code == 401
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], \
        [r.getMessage() for r in caplog.records]
