"""A burst of 200 events across 20 conversations, over real HTTP, to a running connector:
every one acknowledged within Slack's 3 seconds, every message answered exactly once, in
order within its conversation."""

import asyncio
import json
import statistics
import sys
import time
from asyncio.subprocess import PIPE
from pathlib import Path

import pytest

from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response
from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig, last_user_text
from tests.fakes.slack_server import TEAM, FakeSlack

ROOT = Path(__file__).resolve().parent.parent  # where `tests` is a package
CONVERSATIONS = 20
PER_CONVERSATION = 10


def fast_model() -> ScriptedModel:
    """Echoes the newest user message it was shown (no delay, one chunk)."""
    return ScriptedModel(lambda r: Response(text=f"echo: {last_user_text(r)}"),
                         chunk_chars=1000)


@pytest.mark.load
# On PostgreSQL each ack waits for the event to be committed to the shared journal.
@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_a_burst_of_200_events_is_acked_fast_and_answered_once_in_order(
        store, tmp_path, capsys):
    with FakeSlack() as slack:
        users = [f"U0LOAD{c:02d}" for c in range(CONVERSATIONS)]
        async with SlackRig(store, tmp_path, slack, client=fast_model(),
                            allowed_users=users) as rig:
            # A person types one message after another; Slack, another machine, sends
            # them from a process of its own (tests/fakes/slack_burst.py).
            job = {"url": rig.events_url, "conversations": [
                [says(slack, f"D0LOAD{c:02d}", users[c], f"c{c} m{i}")[1]
                 for i in range(PER_CONVERSATION)] for c in range(CONVERSATIONS)]}
            started = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "tests.fakes.slack_burst", stdin=PIPE, stdout=PIPE,
                cwd=ROOT)
            out, _ = await asyncio.wait_for(proc.communicate(json.dumps(job).encode()), 120)
            took = time.perf_counter() - started
            acks = json.loads(out)
            await rig.settle(within=120)

    latencies = sorted(seconds for _, seconds in acks)
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99) - 1]
    with capsys.disabled():
        print(f"\nslack load: {len(acks)} events in {took:.2f}s; ack latency "
              f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, "
              f"max {latencies[-1] * 1000:.1f} ms")
    assert [status for status, _ in acks] == [200] * CONVERSATIONS * PER_CONVERSATION
    assert latencies[-1] < 3.0

    for c in range(CONVERSATIONS):
        channel = f"D0LOAD{c:02d}"
        conv = await store.get_conversation(f"slack:{TEAM}:{channel}")
        log = await store.entries_page(conv.id, limit=200)
        users = [e.seq for e in log if e.kind == "user"]
        finals = [e for e in log if e.kind == "assistant" and (e.data or {}).get("final")]
        uptos = [e.data["answers_upto"] for e in finals]
        # every message is covered by exactly one answer (answers may cover follow-ups
        # that were queued together), and the answers come in the order of the messages
        assert uptos == sorted(set(uptos)) and uptos[-1] >= users[-1]
        spans = list(zip([0, *uptos], uptos, strict=False))
        for seq in users:
            assert sum(1 for low, high in spans if low < seq <= high) == 1
        shown = [m["text"] for m in slack.bot_messages(channel)]
        assert shown == [e.text for e in finals]  # one visible message per answer
        assert not any(m.get("reactions_by_bot") for m in slack.history(channel))  # cleared
        echoed = [int(text.rsplit(" m", 1)[1]) for text in shown]
        assert echoed == sorted(set(echoed)) and echoed[-1] == PER_CONVERSATION - 1
    turns = await store.list_tasks(kind="turn", limit=500)
    assert len(turns) == CONVERSATIONS * PER_CONVERSATION
    assert {t.state for t in turns} == {"done"}
    assert slack.count("chat.postMessage") == sum(
        len(slack.bot_messages(f"D0LOAD{c:02d}")) for c in range(CONVERSATIONS))
