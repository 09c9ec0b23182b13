"""The Events API (HTTP mode) against a running connector: signed requests, Slack's
retries, a replay hours later, forged and stale signatures; DMs answered once."""

import json
import time

import pytest

from tests.fakes.slack_events import deliver, says, signed_headers
from tests.fakes.slack_harness import SlackRig
from tests.fakes.slack_server import BOT_ID, FakeSlack

DM = "D0ALICE"
ALICE = "U0ALICE"


@pytest.fixture
def slack():
    with FakeSlack() as fake:
        fake.add_user(ALICE, "Alice")
        yield fake


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
