"""A home restored from a backup delivers an answer whose every message its predecessor
answered after the snapshot, under other keys (`SlackChannel.find`'s "answered by others"):
nothing is posted, and what Slack shows of that answer's own (the first words it streamed
before the snapshot, " …" at the end) is deleted, not left dangling under the real answer,
and the "working on it" sign is taken off.

In process (tests/fakes/slack_rig.py) against the fake Slack, the home marked restored the
way bot/app/wiring.py marks it (`reconcile_until`)."""

from __future__ import annotations

from bot.agent.inbox import answer_key
from connectors.slack.messages import META_TYPE
from connectors.slack.working import REACTION
from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import BOT_ID, BOT_USER, TEAM
from tests.test_restored_slack import ALICE, DM, answered, until_taken


def streamed(slack, channel: str, text: str, asked: dict, part: int = 1) -> dict:
    """A part of the answer to `asked` as streaming left it (the typing mark at its end)."""
    key = answer_key("slack", f"{channel}:{asked['ts']}") + ".answer"
    if part > 1:
        key += f"#{part}"
    return slack.add_message(channel, {
        "user": BOT_USER, "bot_id": BOT_ID, "text": text + " …", "team": TEAM,
        "metadata": {"event_type": META_TYPE, "event_payload": {"key": key}}})


async def test_a_restored_home_takes_back_its_partial_of_an_answer_given_by_others(
        store, tmp_path, slack):
    # The snapshot: Alice's two questions taken in, the second's turn not yet finished;
    # its answer had begun streaming into Slack (its first words, under its own key).
    zero, _ = says(slack, DM, ALICE, "tok-zero what time is it?")
    one, one_event = says(slack, DM, ALICE, "tok-one and the day?")
    async with SlackRig(store, tmp_path, slack, run_tasks=False) as rig:
        assert (await rig.send(one_event))[0] == 200
        await until_taken(rig, one)
    assert REACTION in slack.history(DM)[1].get("reactions_by_bot", [])  # working on it
    streamed(slack, DM, "echo: tok-o", one)
    # The predecessor's life after the snapshot: one answer to both, under the first's key.
    answered(slack, DM, None, "re tok-zero and tok-one", zero, one)

    async with SlackRig(store, tmp_path, slack, restored=True) as rig:
        await rig.settle()

    assert [m["text"] for m in slack.bot_messages(DM)] == ["re tok-zero and tok-one"]
    [asked] = [m for m in slack.history(DM) if m["ts"] == one["ts"]]
    assert REACTION not in asked.get("reactions_by_bot", [])


async def test_every_streamed_part_of_it_is_taken_back(store, tmp_path, slack):
    """A long answer streams in parts (`KEY`, `KEY#2`): the first may already show its
    final text, the second only its first words; all of them go."""
    zero, _ = says(slack, DM, ALICE, "tok-zero what time is it?")
    one, one_event = says(slack, DM, ALICE, "tok-one and the day?")
    async with SlackRig(store, tmp_path, slack, run_tasks=False) as rig:
        assert (await rig.send(one_event))[0] == 200
        await until_taken(rig, one)
    streamed(slack, DM, "echo: tok-one", one)
    streamed(slack, DM, "and", one, part=2)
    answered(slack, DM, None, "re tok-zero and tok-one", zero, one)

    async with SlackRig(store, tmp_path, slack, restored=True) as rig:
        await rig.settle()

    assert [m["text"] for m in slack.bot_messages(DM)] == ["re tok-zero and tok-one"]
