"""Slack failing for longer than `max_attempts` but shorter than `outage_attempts`: the
answer is late, never lost and never doubled. The delivery tells the runtime what it knows:
`NotPerformed` when Slack certainly showed nothing (a refused connection, a 429), else
`Unavailable` (a 5xx, a connection dropped after the request went out), and a restarted
delivery's look into Slack (`find`) is `Unavailable` while Slack cannot be reached. A
half-streamed answer is finished in its own message once Slack is back, no " …" left."""

import asyncio
import signal
import sys
import time

import pytest

from bot.channels import Outbound
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response
from bot.runtime import NotPerformed, RunnerOptions, Unavailable
from connectors.slack import messages as slack_messages
from connectors.slack import web as slack_web
from connectors.slack.streaming import TYPING
from store import Store, Task
from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import DROP, TEAM, FakeSlack

DM = "D0ALICE"
ALICE = "U0ALICE"
ANSWER = " ".join(f"word{i}" for i in range(40))
# An ordinary error dead-letters a task after 2 tries; an outage is ridden out for 40.
OPTIONS = RunnerOptions(concurrency=8, lease_seconds=5, max_attempts=2, outage_attempts=40,
                        retry_base_seconds=0.05, retry_max_seconds=0.1, poll_seconds=0.05)
FOREVER = 10**6  # failures: until healed


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch):
    """The client's own retries, shortened so that an outage outlasts them quickly."""
    monkeypatch.setattr(slack_web, "RETRY_BACKOFF", 0.01)
    monkeypatch.setattr(slack_web, "RETRY_JITTER", 0.01)
    monkeypatch.setattr(slack_web, "RATE_LIMIT_RETRIES", 1)
    monkeypatch.setattr(slack_messages, "POST_RETRY_SECONDS", 0.01)


def streaming_model() -> ScriptedModel:
    return ScriptedModel([Response(text=ANSWER)], chunk_chars=6, delay=0.03)


async def delivery(store: Store) -> Task | None:
    found = await store.list_tasks(kind="deliver", limit=10)
    assert len(found) <= 1, found
    return found[0] if found else None


async def outlasting_max_attempts(store: Store, *, beyond: int = 0, within: float = 40.0,
                                  ) -> Task:
    """Wait until the delivery has failed more than `max_attempts` tries (after `beyond`)
    and is still pending: an ordinary error would have dead-lettered it by now."""
    deadline = time.monotonic() + within
    d = None
    while time.monotonic() < deadline:
        d = await delivery(store)
        if d is not None:
            assert d.state not in ("failed", "interrupted"), f"given up: {d.error}"
            assert d.state != "done", f"delivered during the outage: {d.result}"
            if d.attempts > OPTIONS.max_attempts + beyond and d.state == "pending":
                return d
        await asyncio.sleep(0.02)
    raise AssertionError(f"the delivery did not keep retrying: {d}")


async def until(check, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def assert_answered_once(store: Store, slack: FakeSlack, text: str) -> None:
    assert [m["text"] for m in slack.bot_messages(DM)] == [text]
    assert {t.state for t in await store.list_tasks(limit=50)} == {"done"}


@pytest.mark.parametrize("failure", ["500", "429"])
async def test_a_post_refused_longer_than_max_attempts_is_posted_once_slack_answers(
        store, tmp_path, slack, failure):
    if failure == "500":  # internal_error: it may have been posted (in doubt)
        slack.fail("chat.postMessage", 500, times=FOREVER)
        expected = Unavailable.__name__
    else:  # rate limited past the client's retries: certainly not posted
        slack.fail("chat.postMessage", 429, times=FOREVER, retry_after=0)
        expected = NotPerformed.__name__
    async with SlackRig(store, tmp_path, slack, options=OPTIONS) as rig:
        _, body = says(slack, DM, ALICE, "hi")
        await rig.send(body)
        d = await outlasting_max_attempts(store)
        assert d.error.startswith(expected), d.error
        assert slack.bot_messages(DM) == []
        slack.heal()
        await rig.settle()
    await assert_answered_once(store, slack, "echo: hi")
    assert slack.count("chat.postMessage", ok_only=True) == 1


async def test_a_post_whose_connection_dropped_and_slack_went_down_shows_once(
        store, tmp_path, slack):
    # The post takes effect, its answer never arrives, and Slack is unreachable after it:
    # the delivery cannot know whether it posted, and must not post again once it can.
    slack.fail("chat.postMessage", DROP, after=True, down=True)
    async with SlackRig(store, tmp_path, slack, options=OPTIONS) as rig:
        _, body = says(slack, DM, ALICE, "hi")
        await rig.send(body)
        await outlasting_max_attempts(store)
        assert slack.is_down
        slack.up()
        await rig.settle()
    await assert_answered_once(store, slack, "echo: hi")
    assert slack.count("chat.postMessage") == 1  # found by its key, not posted again


@pytest.mark.parametrize("outage", ["update-500", "down"])
async def test_a_half_streamed_answer_is_finished_in_its_message_after_an_outage(
        store, tmp_path, slack, outage):
    async with SlackRig(store, tmp_path, slack, client=streaming_model(),
                        options=OPTIONS) as rig:
        _, body = says(slack, DM, ALICE, "talk to me")
        await rig.send(body)
        await until(lambda: slack.count("chat.update", ok_only=True) >= 1, 20,
                    "the streamed message to grow once")
        if outage == "down":
            slack.down()
        else:
            slack.fail("chat.update", 500, times=FOREVER)
        await outlasting_max_attempts(store)
        [partial] = slack.bot_messages(DM)
        assert partial["text"].endswith(TYPING)  # still the half-streamed text
        slack.up()
        slack.heal()
        await rig.settle()
    await assert_answered_once(store, slack, ANSWER)
    assert slack.count("chat.postMessage", ok_only=True) == 1  # edited, never posted again


async def test_a_restart_during_an_outage_finishes_the_same_message(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, client=streaming_model(),
                        options=OPTIONS) as rig:
        _, body = says(slack, DM, ALICE, "talk to me")
        await rig.send(body)
        await until(lambda: slack.count("chat.update", ok_only=True) >= 1, 20,
                    "the streamed message to grow once")
        slack.fail("chat.update", 500, times=FOREVER)
        first = await outlasting_max_attempts(store)
        assert first.error.startswith(Unavailable.__name__), first.error
    slack.heal()
    # A new process; Slack is unreachable once it has started: the delivery, in doubt,
    # looks for its message first and cannot, for longer than max_attempts.
    rig = SlackRig(store, tmp_path, slack, client=streaming_model(), options=OPTIONS,
                   run_tasks=False)
    async with rig:
        slack.down()
        rig.start_runner()
        d = await outlasting_max_attempts(store, beyond=first.attempts)
        assert d.error.startswith(Unavailable.__name__), d.error
        slack.up()
        await rig.settle()
    await assert_answered_once(store, slack, ANSWER)
    assert slack.count("chat.postMessage", ok_only=True) == 1  # edited, never posted again


async def test_send_and_find_tell_the_runtime_what_they_know(store, tmp_path, slack):
    where = {"team": TEAM, "channel": DM, "thread_ts": None, "message_ts": None,
             "user": ALICE}
    message = Outbound(key="T9.answer", conversation_key=f"slack:{TEAM}:{DM}",
                       conversation_id=1, text="hello", reply_to=where)
    async with SlackRig(store, tmp_path, slack, options=OPTIONS, run_tasks=False) as rig:
        channel = rig.connector.channel
        slack.down()
        with pytest.raises(Unavailable):  # cannot look: not an ordinary error
            await channel.find(message)
        with pytest.raises(NotPerformed):  # connection refused: nothing was shown
            await channel.send(message)
        slack.up()
        # The request went out and no answer came back (each retry alike).
        slack.fail("chat.postMessage", DROP, times=slack_messages.POST_ATTEMPTS)
        with pytest.raises(Unavailable):
            await channel.send(message)
        slack.fail("chat.postMessage", 429, retry_after=0, times=2)
        with pytest.raises(NotPerformed):  # rate limited: certainly not posted
            await channel.send(message)
        assert await channel.find(message) is None
        slack.fail("conversations.history", 500, times=FOREVER)
        with pytest.raises(Unavailable):
            await channel.find(message)
        slack.heal()
        await channel.send(message)
        assert (await channel.find(message))["ts"] == slack.bot_messages(DM)[0]["ts"]
    assert [m["text"] for m in slack.bot_messages(DM)] == ["hello"]


async def test_steward_run_rides_out_slack_unreachable_at_start(store_url, tmp_path, slack):
    """A home server boots before its network is up: a real `steward run` started while
    Slack refuses connections stays up, says Slack is connecting, keeps asking (one line a
    try), connects once Slack is back and answers; SIGTERM then exits 0, no traceback."""
    import httpx

    from tests.fakes.llm_server import FakeLLMServer, Reply
    from tests.fakes.slack_events import deliver
    from tests.fakes.slack_rig import free_port
    from tests.test_slack_crash import environment, make_home

    with FakeLLMServer(lambda _r, _w: Reply(text="Here now.")) as llm:
        home, port = tmp_path / "home", free_port()
        make_home(home, store_url, llm.url, slack.url, port)
        slack.down()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "run", env=environment(home, None), cwd=home,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            banner = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
            assert "connectors: slack (connecting)" in banner, banner
            await asyncio.sleep(4.0)  # tries at 1 and 3 s: still down
            assert proc.returncode is None
            slack.up()
            url = f"http://127.0.0.1:{port}/slack/events"
            async with httpx.AsyncClient(timeout=5) as http:
                deadline = time.monotonic() + 30
                while True:  # the Events API opens once Slack said who Steward is
                    try:
                        _, body = says(slack, DM, ALICE, "are you there?")
                        if (await deliver(http, url, body))[0] == 200:
                            break
                    except httpx.TransportError:
                        pass
                    assert time.monotonic() < deadline, "never connected"
                    await asyncio.sleep(0.5)
            while [m["text"] for m in slack.bot_messages(DM)] != ["Here now."]:
                assert time.monotonic() < deadline + 30, slack.bot_messages(DM)
                await asyncio.sleep(0.05)
        except AssertionError as exc:
            failed = exc  # told with what Steward logged meanwhile, below
        else:
            failed = None
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        log = err.decode()
        if failed is not None:
            raise AssertionError(f"{failed}\n--- steward's log:\n{log[-3000:]}") from failed
        assert proc.returncode == 0, log[-3000:]
        assert "Traceback" not in log and "Unclosed client session" not in log, log[-3000:]
        assert "connecting in the background" in log and "slack: connected" in log, log[-3000:]
