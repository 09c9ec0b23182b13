"""Slack messages sent while Steward was down are answered when it is back, however long it
was away: on start (and after a reconnect in Socket Mode) it reads what arrived in the DMs
and the threads it serves since the last message it took, in the DMs of people it never
talked with, and the mentions at the top level of the channels it is in
(`connectors/slack/catchup.py`), through the same deduplicated path as events, so nothing
is answered twice, strangers get what a live message would give them, and nothing older
than `[slack] catchup_hours` is dug up.

A real `steward run` against the fake Slack (HTTP mode) and a fake LLM, stopped and
started again; counted from what the fake Slack server received."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from store import open_store
from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.fakes.slack_events import deliver, mention_of, mentions, says
from tests.fakes.slack_rig import SlackRig, free_port
from tests.fakes.slack_server import TEAM, FakeSlack
from tests.test_slack_crash import start

ALICE, BOB, CAROL, DAVE = "U0ALICE", "U0BOB", "U0CAROL", "U0DAVE"
MALLORY = "U0MALLORY"  # not in allowed_users
SLACK_PEOPLE = ((ALICE, "Alice"), (BOB, "Bob"), (CAROL, "Carol"), (DAVE, "Dave"),
                (MALLORY, "Mallory"))
DM_ALICE, DM_BOB, DM_CAROL, DM_DAVE = "D0ALICE", "D0BOB", "D0CAROL", "D0DAVE"
DM_MALLORY = "D0MALLORY"
CHAN = "C0CATCHUP"
SQLITE = pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
HORIZON_HOURS = 36  # the fake workspace's clock runs ~28 hours behind: its "now" is inside


def last_user_text(request: dict) -> str:
    for m in reversed(request.get("messages") or []):
        if m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content)
    return ""


@pytest.fixture
def llm():
    with FakeLLMServer(lambda request, _wire: Reply(text=f"re: {last_user_text(request)}")
                       ) as server:
        yield server


def make_home(home: Path, store_url: str, llm_url: str, slack_url: str, port: int,
              slack_extra: str = "") -> None:
    home.mkdir(parents=True)
    (home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "openai"
base_url = "{llm_url}/v1"
model = "fake-model"
[slack]
enabled = true
mode = "http"
http_port = {port}
api_base_url = "{slack_url}"
allowed_users = ["{ALICE}", "{BOB}", "{CAROL}", "{DAVE}"]
stream_update_seconds = 0.15
catchup_hours = {HORIZON_HOURS}
{slack_extra}
[runtime]
lease_seconds = 2.0
retry_base_seconds = 0.05
retry_max_seconds = 0.1
drain_seconds = 5.0
""")


async def until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def stop(proc) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(proc.wait(), 60)
    assert code == 0, (code, (await proc.stderr.read()).decode()[-3000:])


def texts(slack: FakeSlack, channel: str, thread_ts: str | None = None) -> list[str]:
    return [m["text"] for m in slack.bot_messages(channel, thread_ts)]


async def test_messages_sent_while_steward_was_down_are_answered_once(
        store_url, tmp_path, slack, llm):
    now = time.time()

    def hours_ago(hours: float, n: int) -> str:
        return f"{int(now - hours * 3600)}.{n:06d}"

    home, port = tmp_path / "home", free_port()
    make_home(home, store_url, llm.url, slack.url, port)
    url = f"http://127.0.0.1:{port}/slack/events"

    # First life: each person says hello in their DM, and Alice mentions Steward in a
    # channel (it follows that thread from then on), all of it written 50 hours ago: the
    # newest message Steward took is older than the horizon when it comes back.
    first = await start(home, port)
    try:
        hellos = [says(slack, dm, user, f"hello from {user}", ts=hours_ago(50, n))[1]
                  for n, (dm, user) in enumerate(((DM_ALICE, ALICE), (DM_BOB, BOB),
                                                  (DM_CAROL, CAROL)), start=1)]
        top, mention = says(slack, CHAN, ALICE, mentions("plan the trip"), ts=hours_ago(50, 9))
        async with httpx.AsyncClient(timeout=20) as http:
            for body in (*hellos, mention):
                assert (await deliver(http, url, body))[0] == 200
        await until(lambda: all(texts(slack, dm) for dm in (DM_ALICE, DM_BOB, DM_CAROL))
                    and texts(slack, CHAN, top["ts"]), 60, "the first life's answers")
    finally:
        await stop(first)
    assert texts(slack, DM_ALICE) == [f"re: hello from {ALICE}"]
    assert texts(slack, CHAN, top["ts"]) == ["re: plan the trip"]

    # While Steward is down: nothing is delivered (or delivered to nobody).
    says(slack, DM_ALICE, ALICE, "token-away while you were away")
    reply, reply_event = says(slack, CHAN, ALICE, "token-reply in the thread",
                              thread_ts=top["ts"])
    async with httpx.AsyncClient(timeout=5) as http:
        with pytest.raises(httpx.TransportError):  # nobody listens; Slack gives up later
            await deliver(http, url, reply_event)
    bob, bob_event = says(slack, DM_BOB, BOB, "token-bob caught up, then retried")
    old, _ = says(slack, DM_CAROL, CAROL, "token-old from before the horizon",
                  ts=hours_ago(HORIZON_HOURS + 4, 3))
    slack.page_cap = 1  # one message a page: read by cursor
    slack.fail("conversations.history", 429, times=1, retry_after=1)  # and rate limited once

    second = await start(home, port)
    try:
        await until(lambda: len(texts(slack, DM_ALICE)) == 2 and len(texts(slack, DM_BOB)) == 2
                    and len(texts(slack, CHAN, top["ts"])) == 2, 90,
                    "the answers to what was said while Steward was down")
        # Slack delivers Bob's message after all, as a retry: taken once.
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await deliver(http, url, bob_event, retry_num=1))[0] == 200
        await asyncio.sleep(3.0)  # room for a wrong second answer to show up
    finally:
        await stop(second)

    assert texts(slack, DM_ALICE) == [f"re: hello from {ALICE}",
                                      "re: token-away while you were away"]
    assert texts(slack, CHAN, top["ts"]) == ["re: plan the trip", "re: token-reply in the thread"]
    assert texts(slack, DM_BOB) == [f"re: hello from {BOB}",
                                    "re: token-bob caught up, then retried"]
    assert texts(slack, DM_CAROL) == [f"re: hello from {CAROL}"]  # the old one: too old
    assert [c.status for c in slack.calls_of("conversations.history")].count(429) == 1
    assert any(c.params.get("cursor") for c in slack.calls_of("conversations.history"))
    assert any(c.params.get("cursor") for c in slack.calls_of("conversations.replies"))
    store = await open_store(store_url)
    try:
        assert await store.submission_state("slack", f"{DM_CAROL}:{old['ts']}") is None
        assert await store.submission_state("slack", f"{DM_BOB}:{bob['ts']}") is not None
        assert {t.state for t in await store.list_tasks(limit=100)} == {"done"}
        assert await store.list_submissions(state="quarantined") == []
        # Where the next catch-up starts: the newest message taken.
        mark = (await store.read_document(f"slack:{TEAM}", "catchup")).value
        assert mark["ts"] == max((m["ts"] for m in (bob, reply)), key=float)
    finally:
        await store.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_socket_mode_reconnect_reads_what_was_said_meanwhile(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, mode="socket",
                        catchup_hours=HORIZON_HOURS) as rig:
        await until(slack.connected, 20, "the socket")
        _, body = says(slack, DM_ALICE, ALICE, "hello")  # a DM Steward knows from now on
        envelope = slack.push(body)
        await until(lambda: slack.acked(envelope), 20, "the ack")
        await until(lambda: texts(slack, DM_ALICE), 30, "the first answer")
        await rig.settle()
        # Slack cannot reach Steward for a while; a message is sent meanwhile (and its
        # envelope is lost: nobody is connected when Slack gives up on it).
        _, body = says(slack, DM_ALICE, ALICE, "said while disconnected")
        slack.disconnect_sockets()
        await until(lambda: slack.socket.connects >= 2 and slack.connected(), 20,
                    "the reconnect")
        await until(lambda: len(texts(slack, DM_ALICE)) == 2, 30,
                    "the answer after the reconnect")
        envelope = slack.push(body)  # and it comes after all
        await until(lambda: slack.acked(envelope), 20, "the ack")
        await rig.settle()
        await asyncio.sleep(0.5)
    assert texts(slack, DM_ALICE) == ["echo: hello", "echo: said while disconnected"]


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_no_catch_up_when_it_is_turned_off(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, catchup_hours=0) as rig:
        _, body = says(slack, DM_ALICE, ALICE, "hello")
        assert (await rig.send(body))[0] == 200
        await until(lambda: texts(slack, DM_ALICE), 30, "the answer")
        await rig.settle()
    says(slack, DM_ALICE, ALICE, "sent while Steward was down")
    reads = len(slack.calls_of("conversations.history") + slack.calls_of("conversations.replies"))
    async with SlackRig(store, tmp_path, slack, catchup_hours=0) as rig:
        await asyncio.sleep(2.0)
        await rig.settle()
    assert texts(slack, DM_ALICE) == ["echo: hello"]
    assert len(slack.calls_of("conversations.history")
               + slack.calls_of("conversations.replies")) == reads  # nothing read at start


# -- first DMs and channel mentions (users.conversations) ----------------------------------


def hours_ago(hours: float, n: int) -> str:
    return f"{int(time.time() - hours * 3600)}.{n:06d}"


def asked(llm: FakeLLMServer, token: str) -> int:
    """The model calls made for a message that says `token`."""
    return sum(token in last_user_text(r.body) for r in llm.requests)


async def a_first_life(slack: FakeSlack, llm: FakeLLMServer, tmp_path: Path, store_url: str,
                       slack_extra: str = "") -> tuple[Path, int, str]:
    """A home where Steward ran once and answered Alice's hello (written 50 hours ago, so
    only the horizon bounds the next catch-up), then stopped: (home, port, events URL)."""
    home, port = tmp_path / "home", free_port()
    make_home(home, store_url, llm.url, slack.url, port, slack_extra)
    url = f"http://127.0.0.1:{port}/slack/events"
    first = await start(home, port)
    try:
        _, hello = says(slack, DM_ALICE, ALICE, "hello", ts=hours_ago(50, 1))
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await deliver(http, url, hello))[0] == 200
        await until(lambda: texts(slack, DM_ALICE), 60, "the first life's answer")
    finally:
        await stop(first)
    return home, port, url


async def test_a_first_dm_sent_while_steward_was_down_is_answered_once(
        store_url, tmp_path, slack, llm):
    """Dave is allowed and never talked with Steward: no transcript of his DM, which only
    users.conversations shows; his first message is answered when Steward is back, and the
    event Slack retries after all is a no-op."""
    home, port, url = await a_first_life(slack, llm, tmp_path, store_url)
    _, dave_event = says(slack, DM_DAVE, DAVE, "token-dave hello, first time")
    second = await start(home, port)
    try:
        await until(lambda: texts(slack, DM_DAVE), 90, "the answer to Dave's first message")
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await deliver(http, url, dave_event, retry_num=1))[0] == 200
        await asyncio.sleep(3.0)  # room for a wrong second answer to show up
    finally:
        await stop(second)
    assert texts(slack, DM_DAVE) == ["re: token-dave hello, first time"]
    assert asked(llm, "token-dave") == 1
    assert texts(slack, DM_ALICE) == ["re: hello"]
    store = await open_store(store_url)
    try:
        dm = await store.get_conversation(f"slack:{TEAM}:{DM_DAVE}")
        assert dm is not None and dm.scope == f"private:slack:{TEAM}:{DAVE}"
        assert {t.state for t in await store.list_tasks(limit=100)} == {"done"}
    finally:
        await store.close()


@SQLITE
@pytest.mark.parametrize("unlisted", ["refuse", "ignore"])
async def test_a_strangers_dm_sent_while_steward_was_down_gets_what_a_live_one_would(
        store_url, tmp_path, slack, llm, unlisted):
    """Mallory is not allowed: her DM, read back, is refused once (`unlisted = "refuse"`)
    or not even read (`"ignore"`), as a live message of hers would be; never answered."""
    home, port, url = await a_first_life(slack, llm, tmp_path, store_url,
                                         f'unlisted = "{unlisted}"')
    _, mallory_event = says(slack, DM_MALLORY, MALLORY, "token-mallory let me in")
    says(slack, DM_DAVE, DAVE, "token-dave hi")  # read in the same pass: it shows it ran
    second = await start(home, port)
    try:
        await until(lambda: texts(slack, DM_DAVE) and (
            unlisted == "ignore" or texts(slack, DM_MALLORY)), 90, "the pass's outcome")
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await deliver(http, url, mallory_event, retry_num=1))[0] == 200
        await asyncio.sleep(3.0)
    finally:
        await stop(second)
    refusals = texts(slack, DM_MALLORY)
    if unlisted == "refuse":
        assert len(refusals) == 1 and "only talk with the people" in refusals[0], refusals
    else:
        assert refusals == []
        assert not [c for c in slack.calls_of("conversations.history")
                    if c.params.get("channel") == DM_MALLORY]
    assert asked(llm, "token-mallory") == 0
    assert texts(slack, DM_DAVE) == ["re: token-dave hi"]


@SQLITE
async def test_a_mention_in_a_channel_sent_while_steward_was_down_is_answered_in_its_thread(
        store_url, tmp_path, slack, llm):
    """Steward is in CHAN: a mention posted there while it was down (its app_mention never
    came) is answered once in a thread under it; the chatter around it gets nothing. The
    conversations are listed once a pass, by cursor."""
    slack.join(CHAN)
    slack.join("C0QUIET")  # nothing new there
    home, port, _ = await a_first_life(slack, llm, tmp_path, store_url)
    says(slack, CHAN, BOB, "token-chatter lunch anyone?")
    top, _ = says(slack, CHAN, BOB, mentions("token-mention book the room"))
    says(slack, CHAN, CAROL, "token-chatter I'm in")
    slack.page_cap = 1  # one conversation (and message) a page
    second = await start(home, port)
    try:
        await until(lambda: texts(slack, CHAN), 90, "the answer to the mention")
        await asyncio.sleep(3.0)
    finally:
        await stop(second)
    [answer] = slack.bot_messages(CHAN)
    assert answer["thread_ts"] == top["ts"] and answer["text"] == "re: token-mention book the room"
    assert asked(llm, "token-mention") == 1 and asked(llm, "token-chatter") == 0
    listings = slack.calls_of("users.conversations")
    assert len([c for c in listings if not c.params.get("cursor")]) == 2  # a pass a life
    assert any(c.params.get("cursor") for c in listings)
    store = await open_store(store_url)
    try:
        thread = await store.get_conversation(f"slack:{TEAM}:{CHAN}:{top['ts']}")
        assert thread is not None and thread.scope == f"channel:{CHAN}"
    finally:
        await store.close()


@SQLITE
async def test_a_mention_older_than_the_horizon_is_not_dug_up(store_url, tmp_path, slack, llm):
    """The last message Steward took is older than `catchup_hours`: a mention from before
    the horizon stays unanswered, one after it is answered, and no read reaches further
    back than the horizon."""
    slack.join(CHAN)
    home, port, _ = await a_first_life(slack, llm, tmp_path, store_url)
    old, _ = says(slack, CHAN, BOB, mentions("token-old from before the horizon"),
                  ts=hours_ago(HORIZON_HOURS + 4, 2))
    new, _ = says(slack, CHAN, BOB, mentions("token-new after it"))
    second = await start(home, port)
    begun = time.time()
    try:
        await until(lambda: texts(slack, CHAN), 90, "the answer to the newer mention")
        await asyncio.sleep(3.0)
    finally:
        await stop(second)
    assert [(m["thread_ts"], m["text"]) for m in slack.bot_messages(CHAN)] == [
        (new["ts"], "re: token-new after it")]
    assert asked(llm, "token-old") == 0
    horizon = begun - HORIZON_HOURS * 3600 - 60
    reads = slack.calls_of("conversations.history") + slack.calls_of("conversations.replies")
    assert reads and all(float(c.params["oldest"]) >= horizon for c in reads
                         if c.params.get("channel") == CHAN and not c.params.get("ts"))
    store = await open_store(store_url)
    try:
        assert await store.submission_state("slack", f"{CHAN}:{old['ts']}") is None
    finally:
        await store.close()


@SQLITE
async def test_a_caught_up_mention_that_arrives_as_a_retried_event_too_is_answered_once(
        store_url, tmp_path, slack, llm):
    """Read back from the channel, then delivered after all (Slack's retries of both events
    it sends for a mention, `app_mention` and `message`): one answer, one model call."""
    slack.join(CHAN)
    home, port, url = await a_first_life(slack, llm, tmp_path, store_url)
    top, message_event = says(slack, CHAN, BOB, mentions("token-twice what is on today?"))
    second = await start(home, port)
    try:
        await until(lambda: texts(slack, CHAN), 90, "the answer to the mention")
        async with httpx.AsyncClient(timeout=20) as http:
            for n, body in enumerate((mention_of(top, CHAN), message_event), start=1):
                assert (await deliver(http, url, body, retry_num=n))[0] == 200
        await asyncio.sleep(3.0)
    finally:
        await stop(second)
    assert [(m["thread_ts"], m["text"]) for m in slack.bot_messages(CHAN)] == [
        (top["ts"], "re: token-twice what is on today?")]
    assert asked(llm, "token-twice") == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_without_the_read_scopes_the_dms_and_threads_it_knows_are_still_read(
        store, tmp_path, slack, caplog):
    """An app installed before the catch-up listed conversations lacks `im:read` and the
    like: Slack answers missing_scope; that is said once, and the DMs Steward knows are
    read as before."""
    slack.missing_scopes = {"im:read", "channels:read"}
    async with SlackRig(store, tmp_path, slack, catchup_hours=HORIZON_HOURS) as rig:
        _, body = says(slack, DM_ALICE, ALICE, "hello")
        assert (await rig.send(body))[0] == 200
        await until(lambda: texts(slack, DM_ALICE), 30, "the answer")
        await rig.settle()
    says(slack, DM_ALICE, ALICE, "sent while Steward was down")
    async with SlackRig(store, tmp_path, slack, catchup_hours=HORIZON_HOURS) as rig:
        await until(lambda: rig.connector.catchup.finished, 30, "the pass")
        await until(lambda: len(texts(slack, DM_ALICE)) == 2, 30, "the answer caught up")
        await rig.settle()
    assert texts(slack, DM_ALICE) == ["echo: hello", "echo: sent while Steward was down"]
    assert [c.status for c in slack.calls_of("users.conversations")] == [200, 200]
    said = [r.getMessage() for r in caplog.records if "will not list" in r.getMessage()]
    assert len(said) == 2 and "needs channels:read,im:read" in said[0], said  # one a process
