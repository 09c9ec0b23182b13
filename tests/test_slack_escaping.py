"""Text through Slack and back, end to end against the fake Slack: Slack's entities are read
once on the way in (the model sees what the person typed) and written once on the way out;
a broadcast mention in an answer, streamed or final, pings nobody."""


from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response
from tests.fakes.slack_events import mention_of, mentions, says
from tests.fakes.slack_rig import SlackRig, echo_model, last_user_text
from tests.fakes.slack_server import TEAM, FakeSlack

DM = "D0ALICE"
CHAN = "C0GENERAL"
ALICE = "U0ALICE"
ZWSP = "\u200b"
BROADCASTS = ("<!channel", "<!here", "<!everyone", "<!subteam")


def posted_texts(slack: FakeSlack) -> list[str]:
    """Every text Steward sent Slack: posts and each edit of a streaming answer."""
    return [str(c.params.get("text", "")) for method in ("chat.postMessage", "chat.update")
            for c in slack.calls_of(method)]


async def test_a_broadcast_in_an_answer_pings_nobody(store, tmp_path, slack):
    answer = "<!channel> hi & bye, <!here> and <!subteam^S0OPS|@ops> too"
    model = ScriptedModel([Response(text=answer)], chunk_chars=4, delay=0.02)
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        top, _ = says(slack, CHAN, ALICE, mentions("tell everyone"))
        await rig.send(mention_of(top, CHAN))
        await rig.settle()
    answers = slack.bot_messages(CHAN)
    assert [m["text"] for m in answers] == [
        f"@{ZWSP}channel hi &amp; bye, @{ZWSP}here and @{ZWSP}ops too"]
    sent = posted_texts(slack)
    assert sent and not [t for t in sent if any(b in t for b in BROADCASTS)], sent


async def test_entities_are_read_once_in_and_written_once_out(store, tmp_path, slack):
    model = echo_model()
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        # Slack sends what Alice typed, "Tom & Jerry <3 <b>", escaped once:
        _, body = says(slack, DM, ALICE, "Tom &amp; Jerry &lt;3 &lt;b&gt; &amp;amp;")
        await rig.send(body)
        await rig.settle()
    assert last_user_text(model.requests[-1]) == "Tom & Jerry <3 <b> &amp;"
    assert [m["text"] for m in slack.bot_messages(DM)] == [
        "echo: Tom &amp; Jerry &lt;3 &lt;b&gt; &amp;amp;"]
    conv = await store.get_conversation(f"slack:{TEAM}:{DM}")
    said = [e.text for e in await store.entries_page(conv.id) if e.kind == "user"]
    assert said == ["Tom & Jerry <3 <b> &amp;"]


async def test_broadcasts_are_posted_when_the_config_allows_them(store, tmp_path, slack):
    model = ScriptedModel([Response(text="<!here> lunch is ready")], chunk_chars=4,
                          delay=0.02)
    async with SlackRig(store, tmp_path, slack, client=model,
                        allow_broadcast_mentions=True) as rig:
        top, _ = says(slack, CHAN, ALICE, mentions("tell everyone"))
        await rig.send(mention_of(top, CHAN))
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(CHAN)] == ["<!here> lunch is ready"]


async def test_a_threads_history_reaches_the_model_unescaped(store, tmp_path, slack):
    model = echo_model()
    async with SlackRig(store, tmp_path, slack, client=model) as rig:
        root = slack.add_message(CHAN, {"user": ALICE, "text": "fish &amp; chips"})
        ask, _ = says(slack, CHAN, ALICE, mentions("where?"), thread_ts=root["ts"])
        await rig.send(mention_of(ask, CHAN))
        await rig.settle()
    seen = [m.content for m in model.requests[-1].messages if m.role == "user"]
    assert seen == ["fish & chips", "where?"]
