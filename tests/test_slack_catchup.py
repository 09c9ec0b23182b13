"""Slack messages sent while Steward was down are answered when it is back, however long it
was away: on start (and after a reconnect in Socket Mode) it reads what arrived in the DMs
and the threads it serves since the last message it took (`connectors/slack/catchup.py`),
through the same deduplicated path as events, so nothing is answered twice and nothing
older than `[slack] catchup_hours` is dug up.

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
from tests.fakes.slack_events import deliver, mentions, says
from tests.fakes.slack_rig import SlackRig, free_port
from tests.fakes.slack_server import TEAM, FakeSlack
from tests.test_slack_crash import start

ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
SLACK_PEOPLE = ((ALICE, "Alice"), (BOB, "Bob"), (CAROL, "Carol"))
DM_ALICE, DM_BOB, DM_CAROL = "D0ALICE", "D0BOB", "D0CAROL"
CHAN = "C0CATCHUP"
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


def make_home(home: Path, store_url: str, llm_url: str, slack_url: str, port: int) -> None:
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
allowed_users = ["{ALICE}", "{BOB}", "{CAROL}"]
stream_update_seconds = 0.15
catchup_hours = {HORIZON_HOURS}
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
