"""Kill a real `steward run` (Slack in HTTP mode, the fake Slack, a slowly streaming fake
LLM) at the dangerous points of answering a Slack message, start it again, and count what
the user sees: exactly one complete answer, on SQLite and PostgreSQL.

The last three points are marked slow (the runtime's own crash tests cover them too)."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from store import open_store
from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.fakes.slack_events import deliver, mention_of, mentions, says
from tests.fakes.slack_rig import ENV, free_port
from tests.fakes.slack_server import TEAM, FakeSlack

ALICE = "U0ALICE"
ANSWER = ("Here is the plan for the week: water the plants on Monday, call the plumber "
          "on Tuesday, pay the electricity bill on Wednesday, and rest for the remaining "
          "days because you have earned it.")

POINTS = [
    "slack-acked",  # the ack was sent; the event may not be stored yet
    "slack-posted",  # while posting: the streamed answer's message was just posted
    "slack-stream-updated",  # while streaming: right after an edit of that message
    "after-result:llm_call",  # between the LLM result and the post
    pytest.param("slack-sent", marks=pytest.mark.slow),  # shown; delivery not recorded
    pytest.param("mid-stream:llm_call", marks=pytest.mark.slow),  # the LLM call restarts
    pytest.param("after-phase:turn.delivered", marks=pytest.mark.slow),  # delivery spawned
]


@pytest.fixture
def llm():
    reply = Reply(text=ANSWER, chunk_chars=4, delay=0.02)
    with FakeLLMServer(lambda _request, _wire: reply) as server:
        yield server


def make_home(home: Path, store_url: str, llm_url: str, slack_url: str, port: int) -> Path:
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
allowed_users = ["{ALICE}"]
stream_update_seconds = 0.15
[runtime]
lease_seconds = 2.0
retry_base_seconds = 0.05
retry_max_seconds = 0.1
drain_seconds = 5.0
""")
    return home


def environment(home: Path, kill_at: str | None,
                extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_", "SLACK_"))}
    env.update(ENV, STEWARD_HOME=str(home), STEWARD_CONFIG=str(home / "config.toml"),
               **(extra or {}))
    if kill_at:
        env["STEWARD_KILL_AT"] = kill_at
    return env


async def start(home: Path, port: int, kill_at: str | None = None,
                extra_env: dict[str, str] | None = None):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=environment(home, kill_at, extra_env),
        cwd=home,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise AssertionError((await proc.stderr.read()).decode()[-3000:])
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return proc
        except OSError:
            await asyncio.sleep(0.05)
    proc.kill()
    raise AssertionError("steward run did not start serving")


async def until(check, within: float, what: str):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def scenario(point: str, home: Path, url: str, llm, slack: FakeSlack):
    dm = f"D0{point.upper().replace(':', '').replace('-', '').replace('.', '')[:12]}"
    port = free_port()
    make_home(home, url, llm.url, slack.url, port)
    first = await start(home, port, kill_at=point)
    _, body = says(slack, dm, ALICE, "what is my plan?")
    async with httpx.AsyncClient(timeout=20) as http:
        status, _ = await deliver(http, f"http://127.0.0.1:{port}/slack/events", body)
    assert status == 200  # acknowledged: from here on it must be answered, once
    code = await asyncio.wait_for(first.wait(), 60)
    assert code == -signal.SIGKILL, (code, (await first.stderr.read()).decode()[-3000:])

    second = await start(home, port)
    try:
        await until(lambda: [m["text"] for m in slack.bot_messages(dm)] == [ANSWER], 60,
                    f"the complete answer; the DM shows {slack.bot_messages(dm)}")
        await asyncio.sleep(0.5)  # room for a wrong second post to show up
    finally:
        second.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(second.wait(), 30) == 0

    answers = slack.bot_messages(dm)
    assert [m["text"] for m in answers] == [ANSWER]
    assert answers[0]["metadata"]["event_payload"]["key"].endswith(".answer")
    posts = [c for c in slack.calls_of("chat.postMessage") if c.params.get("channel") == dm]
    assert len(posts) == 1, posts  # the restart edited the message, never posted again
    assert "hourglass_flowing_sand" not in answers[0].get("reactions_by_bot", [])
    store = await open_store(url)
    try:
        assert {t.state for t in await store.list_tasks(limit=100)} == {"done"}
        conv = await store.get_conversation(f"slack:{TEAM}:{dm}")
        kinds = [e.kind for e in await store.entries_page(conv.id, limit=100)]
        assert kinds.count("user") == 1 and kinds[-1] == "assistant", kinds
    finally:
        await store.close()
    user_message = [m for m in slack.history(dm) if m.get("user") == ALICE][0]
    assert user_message.get("reactions_by_bot") == []  # the working sign was cleared


@pytest.mark.parametrize("point", POINTS)
async def test_a_killed_steward_shows_exactly_one_complete_answer(store_url, tmp_path, llm,
                                                                   slack, point):
    await scenario(point, tmp_path / "home", store_url, llm, slack)


async def test_a_reply_delivered_before_its_mention_is_answered_across_a_kill(
        store_url, tmp_path, llm, slack):
    """The reply in a mention's thread is acked first (and passed over: the thread is not
    followed yet); the mention's commit is followed by a SIGKILL before the thread is read.
    The journal's replay of the mention reads it: both are answered, once each. Whether by
    two answers or by one depends on timing: a reply read in before the mention's turn
    starts is taken in by it (its answer's `answers_upto`), and its own turn finds it
    answered."""
    chan, port, home = "C0CHAOS", free_port(), tmp_path / "home"
    make_home(home, store_url, llm.url, slack.url, port)
    first = await start(home, port, kill_at="slack-submitted")
    top, _ = says(slack, chan, ALICE, mentions("what is my plan?"))
    mention = mention_of(top, chan)
    _, reply = says(slack, chan, ALICE, "and for the weekend?", thread_ts=top["ts"])
    url = f"http://127.0.0.1:{port}/slack/events"
    async with httpx.AsyncClient(timeout=20) as http:
        assert (await deliver(http, url, reply))[0] == 200
        await asyncio.sleep(0.5)  # taken and passed over before the mention arrives
        assert (await deliver(http, url, mention))[0] == 200
    assert await asyncio.wait_for(first.wait(), 60) == -signal.SIGKILL

    key = f"slack:{TEAM}:{chan}:{top['ts']}"
    second = await start(home, port)
    store = await open_store(store_url)
    try:
        async def answered() -> tuple[list, list] | None:
            """(the user entries, the final answers) once both messages are in, every
            turn has ended and the channel shows each answer; None before."""
            conv = await store.get_conversation(key)
            if conv is None:
                return None
            entries = await store.entries_page(conv.id, limit=100)
            users = [e for e in entries if e.kind == "user"]
            finals = [e for e in entries if e.kind == "assistant" and (e.data or {}).get("final")]
            turns = await store.list_tasks(kind="turn", conversation_id=conv.id, active=True)
            if len(users) < 2 or turns or len(slack.bot_messages(chan)) < len(finals):
                return None
            return users, finals

        for _ in range(600):  # 60 s
            if done := await answered():
                break
            await asyncio.sleep(0.1)
        if not done:  # what the second life said, and where it waits
            second.send_signal(signal.SIGUSR1)
            await asyncio.sleep(1.0)
            second.kill()
            said = (await second.stderr.read()).decode(errors="replace")[-12000:]
            raise AssertionError(f"not both answered; the channel shows "
                                 f"{slack.bot_messages(chan)}\n{said}")
        await asyncio.sleep(0.5)  # room for a wrong second post to show up
        users, finals = done
        assert [e.text for e in users] == ["what is my plan?", "and for the weekend?"]
        # Each message is answered by exactly one answer (of a turn of its own), and each
        # answer is shown once: the mention's alone, the reply's after it; or one for both.
        upto = [e.data["answers_upto"] for e in finals]
        mention, follow_up = users[0].seq, users[1].seq
        assert (len(upto) == 1 and upto[0] >= follow_up) or (
            len(upto) == 2 and mention <= upto[0] < follow_up <= upto[1]), upto
        assert len({e.task_id for e in finals}) == len(finals)
        answers = slack.bot_messages(chan)
        assert [m["text"] for m in answers] == [ANSWER] * len(finals)
        assert [m.get("thread_ts") for m in answers] == [top["ts"]] * len(finals)
    finally:
        await store.close()
        if second.returncode is None:
            second.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(second.wait(), 30) == 0
