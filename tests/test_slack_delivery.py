"""Answers in Slack: streamed into one message, split when long, found again by their key
(no second post), rate limits and server errors, and the inbound journal."""

import json

from bot.channels import Outbound
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response
from connectors.slack.journal import Journal
from connectors.slack.messages import META_TYPE
from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig, echo_model
from tests.fakes.slack_server import TEAM

DM = "D0ALICE"
ALICE = "U0ALICE"
KEY = f"slack:{TEAM}:{DM}"


def keys(messages):
    return [m["metadata"]["event_payload"]["key"] for m in messages]


async def test_an_answer_streams_into_one_message(store, tmp_path, slack):
    answer = " ".join(f"word{i}" for i in range(60))
    model = ScriptedModel([Response(text=answer)], chunk_chars=6, delay=0.03)
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        _, body = says(slack, DM, ALICE, "talk to me")
        await rig.send(body)
        await rig.settle()
    [message] = slack.bot_messages(DM)
    assert message["text"] == answer
    assert message["metadata"]["event_type"] == META_TYPE
    assert slack.count("chat.postMessage") == 1
    updates = [c.params["text"] for c in slack.calls_of("chat.update")]
    assert len(updates) >= 3, updates  # the answer grew in place
    assert all(u.endswith(" …") for u in updates[:-1]) and updates[-1] == answer
    assert all(answer.startswith(u.removesuffix(" …")) for u in updates)


UPDATE_EVERY = 0.5  # `[slack] stream_update_seconds` in the test below
JITTER = 0.05  # clock noise: the fake stamps a call when it has done it


async def test_a_fast_stream_edits_its_message_no_faster_than_stream_update_seconds(
        store, tmp_path, slack):
    # The model streams a chunk every ~10 ms and the agent commits a partial every ~100 ms;
    # Slack sees the message written (posted, then edited) at most every UPDATE_EVERY, the
    # final edit included, and the whole answer in the end.
    answer = " ".join(f"word{i}" for i in range(120))
    model = ScriptedModel([Response(text=answer)], chunk_chars=4, delay=0.01)
    async with SlackRig(store, tmp_path, slack, client=model,
                        stream_update_seconds=UPDATE_EVERY) as rig:
        _, body = says(slack, DM, ALICE, "talk to me, fast")
        await rig.send(body)
        await rig.settle()
    [message] = slack.bot_messages(DM)
    assert message["text"] == answer
    [post] = slack.calls_of("chat.postMessage")
    updates = [c for c in slack.calls_of("chat.update") if c.params["ts"] == message["ts"]]
    assert len(updates) >= 3, [u.params["text"] for u in updates]  # it did stream
    assert updates[-1].params["text"] == answer
    assert all(u.params["text"].endswith(" …") for u in updates[:-1])
    writes = [post.at] + [u.at for u in updates]
    gaps = [round(b - a, 3) for a, b in zip(writes, writes[1:], strict=False)]
    assert min(gaps) >= UPDATE_EVERY - JITTER, gaps


async def test_a_long_answer_is_split_into_keyed_parts(store, tmp_path, slack):
    paragraph = "A sentence that goes on. " * 40
    answer = "\n\n".join(f"{i}. {paragraph}" for i in range(10))  # ~10 000 characters
    model = ScriptedModel([Response(text=answer)], chunk_chars=500)
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        _, body = says(slack, DM, ALICE, "tell me everything")
        await rig.send(body)
        await rig.settle()
    parts = slack.bot_messages(DM)
    assert len(parts) == 4  # three paragraphs fit in a message
    turn_key = keys(parts)[0]
    assert keys(parts) == [turn_key, f"{turn_key}#2", f"{turn_key}#3", f"{turn_key}#4"]
    assert all(len(p["text"]) <= 3500 for p in parts)
    assert " ".join(p["text"] for p in parts).split() == answer.split()


async def test_a_rate_limited_post_waits_and_posts_once(store, tmp_path, slack):
    slack.fail("chat.postMessage", 429, times=1, retry_after=1)
    async with SlackRig(store, tmp_path, slack) as rig:
        _, body = says(slack, DM, ALICE, "hi")
        await rig.send(body)
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: hi"]
    posts = slack.calls_of("chat.postMessage")
    assert [c.status for c in posts] == [429, 200]
    assert posts[1].at - posts[0].at >= 0.9  # Retry-After was honoured


async def test_a_post_whose_answer_was_lost_is_found_not_repeated(store, tmp_path, slack):
    slack.fail("chat.postMessage", 500, times=1, after=True)  # posted, but answered 500
    slack.fail("chat.update", 500, times=2)  # retried by the client
    async with SlackRig(store, tmp_path, slack) as rig:
        _, body = says(slack, DM, ALICE, "hi")
        await rig.send(body)
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: hi"]
    assert slack.count("chat.postMessage") == 1


async def test_send_and_find_use_the_key_across_processes(store, tmp_path, slack):
    where = {"team": TEAM, "channel": DM, "thread_ts": None, "message_ts": None,
             "user": ALICE}
    message = Outbound(key="T1.answer", conversation_key=KEY, conversation_id=1,
                       text="**done**", reply_to=where)
    async with SlackRig(store, tmp_path, slack) as rig:
        assert await rig.connector.channel.find(message) is None
        first = await rig.connector.channel.send(message)
        again = await rig.connector.channel.send(message)
        assert first == again
    async with SlackRig(store, tmp_path, slack) as rig:  # a new process: nothing in memory
        found = await rig.connector.channel.find(message)
        assert found is not None and found["ts"] == first["ts"]
        changed = Outbound(**{**message.__dict__, "text": "**done**, and more"})
        assert await rig.connector.channel.find(changed) is None
        await rig.connector.channel.send(changed)
    assert [m["text"] for m in slack.bot_messages(DM)] == ["*done*, and more"]
    assert slack.count("chat.postMessage") == 1


async def test_events_journaled_before_a_crash_are_processed_on_start(store, tmp_path, slack):
    _, body = says(slack, DM, ALICE, "did you get this?")
    _, done = says(slack, DM, ALICE, "this one was handled")
    journal = tmp_path / "slack-inbox.jsonl"
    journal.write_text(json.dumps({"event": body}) + "\n" + json.dumps({"event": done}) + "\n"
                       + json.dumps({"done": done["event_id"]}) + "\n" + '{"event": {"tor')
    async with SlackRig(store, tmp_path, slack, client=echo_model()) as rig:
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: did you get this?"]
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert {"done": body["event_id"]} in lines


async def test_an_answer_someone_deleted_in_slack_is_posted_again(store, tmp_path, slack):
    where = {"team": TEAM, "channel": DM, "thread_ts": None, "message_ts": None,
             "user": ALICE}
    first = Outbound(key="T2.answer", conversation_key=KEY, conversation_id=1,
                     text="draft", reply_to=where)
    async with SlackRig(store, tmp_path, slack) as rig:
        shown = await rig.connector.channel.send(first)
        slack.delete_message(DM, shown["ts"])  # an admin removed it
        await rig.connector.channel.send(Outbound(**{**first.__dict__, "text": "final"}))
    assert [m["text"] for m in slack.bot_messages(DM)] == ["final"]


async def test_the_journal_keeps_only_what_is_pending(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", compact_bytes=2000)
    assert await journal.open() == []
    for n in range(30):
        await journal.append({"event_id": f"E{n}", "event": {"text": "x" * 100}})
        if n != 7:
            journal.done(f"E{n}")
    await journal.close()
    assert (tmp_path / "j.jsonl").stat().st_size < 4000  # rewritten along the way
    again = Journal(tmp_path / "j.jsonl")
    assert [b["event_id"] for b in await again.open()] == ["E7"]
