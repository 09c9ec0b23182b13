"""users.info failing (a 5xx outlasting the client's retries, a dropped connection) never
fails the message it was asked for: a known person keeps their last known name and zone, a
new one is their id with no zone for now, and Slack is asked again after a short back-off
(`RETRY_SECONDS`), not after the hour a good answer is kept (`FRESH_SECONDS`)."""

import pytest

from connectors.slack import history
from connectors.slack import web as slack_web
from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import DROP, TEAM, FakeSlack

DM = "D0ALICE"
ALICE = "U0ALICE"
TOKYO, PARIS = "Asia/Tokyo", "Europe/Paris"
FOREVER = 10**6  # failures: until healed


@pytest.fixture
def slack():
    with FakeSlack() as fake:
        fake.add_user(ALICE, "Alice", tz=TOKYO)
        yield fake


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """The client's own retries, shortened so that a failure outlasts them quickly."""
    monkeypatch.setattr(slack_web, "RETRY_BACKOFF", 0.01)
    monkeypatch.setattr(slack_web, "RETRY_JITTER", 0.01)


async def said(rig: SlackRig, slack: FakeSlack, text: str) -> tuple[str, str | None]:
    """Alice says `text` in her DM; once it is answered, its entry's (author, timezone)."""
    _, body = says(slack, DM, ALICE, text)
    await rig.send(body)
    await rig.settle()
    assert f"echo: {text}" in [m["text"] for m in slack.bot_messages(DM)], \
        f"{text!r} was not answered"
    conv = await rig.store.get_conversation(f"slack:{TEAM}:{DM}")
    [entry] = [e for e in await rig.store.entries_page(conv.id, limit=100)
               if e.kind == "user" and e.text == text]
    return entry.author, (entry.data or {}).get("timezone")


@pytest.mark.parametrize("status", [500, DROP], ids=["500", "dropped"])
async def test_a_failed_refresh_keeps_the_known_profile_and_retries_soon(
        store, tmp_path, slack, monkeypatch, status):
    monkeypatch.setattr(history, "FRESH_SECONDS", 0.0)  # every message asks again
    async with SlackRig(store, tmp_path, slack) as rig:
        assert await said(rig, slack, "first") == ("Alice", TOKYO)
        slack.fail("users.info", status, times=FOREVER)
        asked = slack.count("users.info")
        assert await said(rig, slack, "during the outage") == ("Alice", TOKYO)
        assert slack.count("users.info") > asked  # it was asked, and failed
        asked = slack.count("users.info")
        assert await said(rig, slack, "still down") == ("Alice", TOKYO)
        assert slack.count("users.info") == asked  # not asked again within the back-off
        slack.heal()
        slack.set_tz(ALICE, PARIS)  # she travelled meanwhile
        monkeypatch.setattr(history, "RETRY_SECONDS", 0.0)
        assert await said(rig, slack, "back") == ("Alice", PARIS)


@pytest.mark.parametrize("status", [500, DROP], ids=["500", "dropped"])
async def test_a_failed_first_look_up_answers_with_the_id_and_retries_soon(
        store, tmp_path, slack, monkeypatch, status):
    slack.fail("users.info", status, times=FOREVER)
    async with SlackRig(store, tmp_path, slack) as rig:
        assert await said(rig, slack, "hello") == (ALICE, None)
        asked = slack.count("users.info")
        assert asked > 0
        assert await said(rig, slack, "still down") == (ALICE, None)
        assert slack.count("users.info") == asked  # not asked again within the back-off
        slack.heal()
        monkeypatch.setattr(history, "RETRY_SECONDS", 0.0)
        assert await said(rig, slack, "back") == ("Alice", TOKYO)
        asked = slack.count("users.info")
        assert await said(rig, slack, "later") == ("Alice", TOKYO)
        assert slack.count("users.info") == asked  # a good answer is kept FRESH_SECONDS
