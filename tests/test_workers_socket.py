"""Several `steward run` workers on one PostgreSQL store with Slack in Socket Mode: each
worker holds a websocket of its own, and the fake Slack spreads envelopes over the open
connections, round-robin, as Slack does; an envelope not acked in time is sent again, to
another connection (a few acks are lost on the way, so some events reach two workers).
Two workers are SIGKILLed (one mid-turn, one mid-delivery) and not restarted; every
message is answered exactly once: one chat.postMessage, one visible answer, in its DM or
in the thread under its mention."""

import asyncio
import re
from collections import Counter

import pytest

from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.fakes.slack_events import mention_of, mentions, says
from tests.test_workers import ALICE, ANSWER, Worker, until

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

CHANNELS = ("C0TEAM", "C0OPS")


@pytest.fixture
def llm():
    reply = Reply(text=ANSWER, chunk_chars=6, delay=0.02)  # streamed, as in test_workers
    with FakeLLMServer(lambda _request, _wire: reply) as server:
        yield server


class SocketWorker(Worker):
    """A `steward run` in Socket Mode: no port of its own, one websocket to the fake."""

    def __init__(self, root, n, store_url, llm, slack):
        super().__init__(root, n, store_url, llm, slack)
        self.slack = slack
        config = self.home / "config.toml"
        text = config.read_text().replace('mode = "http"', 'mode = "socket"')
        config.write_text(re.sub(r"http_port = \d+\n", "", text))

    async def ready(self) -> bool:
        return "connected in Socket Mode" in self.tail(200000)


def posts(slack, asks) -> dict[tuple[str, str | None], int]:
    """chat.postMessage calls Slack took, per message asked (its DM, or its thread)."""
    made = Counter((c.params.get("channel"), c.params.get("thread_ts") or None)
                   for c in slack.calls_of("chat.postMessage") if c.status == 200)
    return {ask: made[ask] for ask in asks}


def shown(slack, asks) -> dict[tuple[str, str | None], list[str]]:
    """The answers people see, per message asked."""
    return {(channel, thread): [m["text"] for m in slack.bot_messages(channel, thread)]
            for channel, thread in asks}


async def test_three_socket_mode_workers_two_killed_answer_every_message_once(
        store_url, tmp_path, llm, slack):
    workers = [SocketWorker(tmp_path, n, store_url, llm, slack) for n in range(3)]
    try:
        # One dies between its first LLM result and the post; one right after a post.
        await asyncio.gather(workers[0].start(kill_at="after-result:llm_call"),
                             workers[1].start(kill_at="slack-posted"), workers[2].start())
        await until(lambda: slack.connected() == 3, 10, "three connections", workers)
        slack.lose_acks(6)  # those envelopes come again, after Slack's 3 s, to another worker
        asks: list[tuple[str, str | None]] = []  # (channel, thread) each answer goes to
        for n in range(24):
            if n % 3 == 2:  # a mention in a channel: answered in a thread under it
                channel = CHANNELS[n % 2]
                top, body = says(slack, channel, ALICE, mentions(f"question {n}"))
                slack.push(mention_of(top, channel))  # Slack sends both event types,
                slack.push(body)  # each to a connection of its own
                asks.append((channel, top["ts"]))
            else:
                dm = f"D0S{n:02d}"
                _, body = says(slack, dm, ALICE, f"question {n}")
                slack.push(body)
                asks.append((dm, None))
            await asyncio.sleep(0.1)
        await until(lambda: not workers[0].alive and not workers[1].alive, 60,
                    "both kill points to be reached", workers)
        first = Counter(d.connection for d in slack.socket.deliveries if not d.retry_attempt)
        assert len(first) == 3 and None not in first, first  # spread over all three
        await until(lambda: all(texts == [ANSWER] for texts in shown(slack, asks).values()),
                    120, "every message answered", workers)
        await until(lambda: not slack.unacked(), 30, "every envelope acked", workers)
        assert len(slack.socket.lost) == 6
        assert len([d for d in slack.socket.deliveries if d.retry_attempt]) >= 6
        await asyncio.sleep(3.0)  # anything answered twice would show now
        assert {ask: n for ask, n in posts(slack, asks).items() if n != 1} == {}
        seen = shown(slack, asks)
        assert {ask: texts for ask, texts in seen.items() if texts != [ANSWER]} == {}
        assert all(len(slack.bot_messages(c)) == sum(1 for a in asks if a[0] == c)
                   for c in {channel for channel, _ in asks})  # nothing anywhere else
    finally:
        for w in workers[:2]:
            await w.kill()
        code = await workers[2].stop()
    assert code == 0, workers[2].tail(20000)  # with its tasks' stacks, if it hung
