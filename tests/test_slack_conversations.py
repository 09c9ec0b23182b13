"""Which Slack messages make which conversations: DMs, threads, mentions, followed threads,
history read on entering a thread, and who may talk to Steward."""


from tests.fakes.slack_events import mention_of, mentions, says
from tests.fakes.slack_rig import SlackRig, echo_model
from tests.fakes.slack_server import TEAM

DM = "D0ALICE"
CHAN = "C0GENERAL"
ALICE, BOB, MALLORY = "U0ALICE", "U0BOB", "U0MALLORY"


SLACK_PEOPLE = ((ALICE, "Alice"), (BOB, "Bob"), (MALLORY, "Mallory"))  # `slack`'s


async def texts(store, key: str) -> list[tuple[str, str]]:
    conv = await store.get_conversation(key)
    return [(e.kind, e.text) for e in await store.entries_page(conv.id, limit=100)]


async def test_channel_mention_opens_a_thread_that_steward_then_follows(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, allowed_users=[ALICE, BOB]) as rig:
        top, body = says(slack, CHAN, ALICE, mentions("what is up?"))
        await rig.send(mention_of(top, CHAN))  # Slack sends both event types...
        await rig.send(body)  # ...for the same message
        await rig.settle()
        _, reply = says(slack, CHAN, BOB, "and for me?", thread_ts=top["ts"])
        await rig.send(reply)
        _, chatter = says(slack, CHAN, BOB, "lunch anyone?")  # top level, no mention
        await rig.send(chatter)
        await rig.settle()
    answers = slack.bot_messages(CHAN)
    assert [(m["text"], m["thread_ts"]) for m in answers] == [
        ("echo: what is up?", top["ts"]), ("echo: and for me?", top["ts"])]
    key = f"slack:{TEAM}:{CHAN}:{top['ts']}"
    assert [k for k, _ in await texts(store, key)] == ["user", "assistant", "user", "assistant"]
    assert len(await store.list_conversations()) == 1


async def test_entering_an_existing_thread_reads_its_history(store, tmp_path, slack):
    model = echo_model()
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        root = slack.add_message(CHAN, {"user": BOB, "text": "the boiler is broken"})
        slack.add_message(CHAN, {"user": MALLORY, "text": "since Monday",
                                 "thread_ts": root["ts"]})
        ask, _ = says(slack, CHAN, ALICE, mentions("can you summarise?"),
                      thread_ts=root["ts"])
        await rig.send(mention_of(ask, CHAN))
        await rig.settle()
    key = f"slack:{TEAM}:{CHAN}:{root['ts']}"
    assert await texts(store, key) == [
        ("user", "the boiler is broken"), ("user", "since Monday"),
        ("user", "can you summarise?"), ("assistant", "echo: can you summarise?")]
    seen = [m.content for m in model.requests[-1].messages if m.role == "user"]
    assert seen == ["the boiler is broken", "since Monday", "can you summarise?"]
    conv = await store.get_conversation(key)
    history = [e for e in await store.entries_page(conv.id) if (e.data or {}).get("history")]
    assert [e.author for e in history] == ["Bob", "Mallory"]


async def test_a_thread_in_a_dm_is_its_own_conversation(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        first, body = says(slack, DM, ALICE, "top level")
        await rig.send(body)
        await rig.settle()
        _, threaded = says(slack, DM, ALICE, "in a thread", thread_ts=first["ts"])
        await rig.send(threaded)
        await rig.settle()
    keys = sorted(c.key for c in await store.list_conversations())
    assert keys == [f"slack:{TEAM}:{DM}", f"slack:{TEAM}:{DM}:{first['ts']}"]
    answers = slack.bot_messages(DM)
    assert [(m["text"], m.get("thread_ts")) for m in answers] == [
        ("echo: top level", None), ("echo: in a thread", first["ts"])]


async def test_unlisted_people_are_refused_once_per_conversation(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        for text in ("hi", "hello?", "anyone?"):
            _, body = says(slack, "D0MALLORY", MALLORY, text)
            await rig.send(body)
            await rig.settle()
    answers = slack.bot_messages("D0MALLORY")
    assert len(answers) == 1 and "only talk with the people" in answers[0]["text"]
    conv = await store.get_conversation(f"slack:{TEAM}:D0MALLORY")
    assert await store.entries_page(conv.id) == []  # nothing of theirs reaches the agent


async def test_unlisted_ignore_and_fail_closed(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, unlisted="ignore") as rig:
        _, body = says(slack, "D0MALLORY", MALLORY, "hi")
        await rig.send(body)
        await rig.settle()
    async with SlackRig(store, tmp_path, slack, allowed_users=[]) as rig:  # nobody
        _, body = says(slack, DM, ALICE, "me neither?")
        await rig.send(body)
        await rig.settle()
    assert slack.bot_messages("D0MALLORY") == []
    assert ["only talk with" in m["text"] for m in slack.bot_messages(DM)] == [True]


async def test_allow_everyone_and_allowed_channels(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, allowed_users=[], allow_everyone=True,
                        allowed_channels=[CHAN]) as rig:
        top, _ = says(slack, CHAN, MALLORY, mentions("open house?"))
        await rig.send(mention_of(top, CHAN))
        elsewhere, _ = says(slack, "C0RANDOM", MALLORY, mentions("here too?"))
        await rig.send(mention_of(elsewhere, "C0RANDOM"))
        _, dm = says(slack, "D0MALLORY", MALLORY, "and in private?")
        await rig.send(dm)
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(CHAN)] == ["echo: open house?"]
    assert ["only talk with" in m["text"] for m in slack.bot_messages("C0RANDOM")] == [True]
    assert [m["text"] for m in slack.bot_messages("D0MALLORY")] == ["echo: and in private?"]


async def test_other_bots_only_with_answer_bots(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, answer_bots=True,
                        allowed_users=[ALICE, "B0HELPER"]) as rig:
        _, body = says(slack, DM, "", "a report from the helper bot", bot_id="B0HELPER")
        await rig.send(body)
        _, stranger = says(slack, DM, "", "spam", bot_id="B0SPAM")  # not allowed: silence
        await rig.send(stranger)
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: a report from the helper bot"]


async def test_a_thread_reply_that_arrives_before_the_mention_is_answered(store, tmp_path,
                                                                         slack):
    """Slack does not promise order across retries: the reply in the thread a mention
    started can be delivered (and acked) before the mention itself. Both are answered, in
    the thread, the mention first."""
    async with SlackRig(store, tmp_path, slack, allowed_users=[ALICE, BOB]) as rig:
        top, body = says(slack, CHAN, ALICE, mentions("what is up?"))
        mention = mention_of(top, CHAN)  # as posted: no thread yet
        _, reply = says(slack, CHAN, BOB, "and for me?", thread_ts=top["ts"])
        await rig.send(reply)
        await rig.settle()
        await rig.send(mention)
        await rig.send(body)
        await rig.settle()
        # The catch-up submits the reply right behind the mention: one turn may answer
        # both (it then echoes the last), or each gets its own; the last answer is the
        # reply's either way, and every answer is in the thread.
        answers = [(m["text"], m["thread_ts"]) for m in slack.bot_messages(CHAN)]
        assert answers in ([("echo: and for me?", top["ts"])],
                           [("echo: what is up?", top["ts"]), ("echo: and for me?", top["ts"])])
        await rig.send(reply, retry_num=1)  # a late retry of the reply changes nothing
        await rig.settle()
    assert [(m["text"], m["thread_ts"]) for m in slack.bot_messages(CHAN)] == answers
    key = f"slack:{TEAM}:{CHAN}:{top['ts']}"
    said = [t for k, t in await texts(store, key) if k == "user"]
    assert said == ["what is up?", "and for me?"]


async def test_a_dm_message_is_answered_when_a_reply_under_it_is_processed_first(
        store, tmp_path, slack):
    """The thread's history records the DM message it hangs under as context; that must
    not pass for the DM message's own event having been handled."""
    async with SlackRig(store, tmp_path, slack) as rig:
        first, body = says(slack, DM, ALICE, "top level")
        _, threaded = says(slack, DM, ALICE, "in a thread", thread_ts=first["ts"])
        await rig.send(threaded)
        await rig.settle()
        await rig.send(body)
        await rig.settle()
    answers = slack.bot_messages(DM)
    assert sorted((m["text"], m.get("thread_ts") or "") for m in answers) == [
        ("echo: in a thread", first["ts"]), ("echo: top level", "")]
    assert [t for k, t in await texts(store, f"slack:{TEAM}:{DM}") if k == "user"] == [
        "top level"]
