"""Memory scopes of Slack conversations, by the importer's rule: a DM with Steward (and
each thread in it) is private to that person; a channel, private channel or group DM is
shared, so every thread in it has the scope `channel:<id>` whoever asked there. Long-term
facts and `search_history` follow the scope: what was said in a DM never reaches a
channel, and what was said in a channel reaches every thread of it."""


from bot.llm.scripted import ScriptedModel
from bot.llm.types import Request, Response, ToolCall
from bot.memory.facts import FACT_TOOLS, facts_for
from bot.memory.search import search_history
from tests.fakes.slack_events import mention_of, mentions, says
from tests.fakes.slack_rig import SlackRig, last_user_text
from tests.fakes.slack_server import TEAM

DM = "D0ALICE"
CHAN = "C0GENERAL"
GROUP = "G0TRIO"  # a group DM (mpim): its id does not say so, its events do
ALICE, BOB, MALLORY = "U0ALICE", "U0BOB", "U0MALLORY"


SLACK_PEOPLE = ((ALICE, "Alice"), (BOB, "Bob"), (MALLORY, "Mallory"))  # `slack`'s


def memory_model() -> ScriptedModel:
    """"remember X" keeps a fact, "search X" searches the history; otherwise "ok". A tool
    result is answered with itself."""
    def reply(request: Request) -> Response:
        last = request.messages[-1]
        if last.role == "tool":
            return Response(text=f"tool said: {last.content}")
        said = last_user_text(request)
        for verb, tool, arg in (("remember ", "remember_fact", "fact"),
                                ("search ", "search_history", "query")):
            if said.startswith(verb):
                return Response(tool_calls=[ToolCall(
                    id=f"c{len(request.messages)}", name=tool,
                    arguments={arg: said.removeprefix(verb)})])
        return Response(text="ok")
    return ScriptedModel(reply)


def prompt_for(model: ScriptedModel, said: str) -> str:
    """The system prompt (long-term facts included) of the request answering `said`."""
    [request] = [r for r in model.requests if r.messages[-1].role == "user"
                 and r.messages[-1].content == said]
    return request.messages[0].content


def tool_result_for(model: ScriptedModel, said: str) -> str:
    [request] = [r for r in model.requests if r.messages[-1].role == "tool"
                 and last_user_text(r) == said]
    return request.messages[-1].content


def thread_key(channel: str, ts: str) -> str:
    return f"slack:{TEAM}:{channel}:{ts}"


async def scope_of(store, key: str) -> str:
    return (await store.get_conversation(key)).scope


async def test_dm_facts_stay_private_and_channel_facts_reach_every_thread(
        store, tmp_path, slack):
    model = memory_model()
    async with SlackRig(store, tmp_path, slack, client=model, allowed_users=[ALICE, BOB],
                        tools=[*FACT_TOOLS, search_history]) as rig:
        _, body = says(slack, DM, ALICE, "remember my locker code is 4711")
        await rig.send(body)
        await rig.settle()
        told, body = says(slack, CHAN, ALICE, mentions("remember the boiler is in room 3"))
        await rig.send(body)
        await rig.settle()
        for user, said in ((ALICE, "what do you know, says alice"),
                           (BOB, "what do you know, says bob")):
            _, body = says(slack, CHAN, user, mentions(said))
            await rig.send(body)
            await rig.settle()
        _, body = says(slack, DM, ALICE, "what do you know, in private")
        await rig.send(body)
        await rig.settle()

    assert await scope_of(store, f"slack:{TEAM}:{DM}") == f"private:slack:{TEAM}:{ALICE}"
    assert await scope_of(store, thread_key(CHAN, told["ts"])) == f"channel:{CHAN}"
    # Alice's own channel thread: the channel's fact, never her DM's (everyone reads it)
    alice_in_channel = prompt_for(model, "what do you know, says alice")
    assert "the boiler is in room 3" in alice_in_channel
    assert "4711" not in alice_in_channel
    # Bob, in another thread of the channel: what was said in the channel, nothing private
    bob_in_channel = prompt_for(model, "what do you know, says bob")
    assert "the boiler is in room 3" in bob_in_channel
    assert "4711" not in bob_in_channel
    # and the channel's fact is not Alice's private memory either
    in_private = prompt_for(model, "what do you know, in private")
    assert "my locker code is 4711" in in_private
    assert "boiler" not in in_private


async def test_search_in_a_channel_thread_sees_the_channel_and_no_dm(store, tmp_path, slack):
    model = memory_model()
    async with SlackRig(store, tmp_path, slack, client=model, allowed_users=[ALICE, BOB],
                        tools=[search_history]) as rig:
        _, body = says(slack, DM, ALICE, "my locker code is 4711, keep it between us")
        await rig.send(body)
        await rig.settle()
        _, body = says(slack, CHAN, ALICE, mentions("the boiler in room 3 is leaking"))
        await rig.send(body)
        await rig.settle()
        for said in ("search boiler", "search locker"):
            _, body = says(slack, CHAN, BOB, mentions(said))  # each opens its own thread
            await rig.send(body)
            await rig.settle()

    found = tool_result_for(model, "search boiler")
    assert "the boiler in room 3 is leaking" in found
    assert "4711" not in tool_result_for(model, "search locker")


async def test_threads_in_a_dm_are_private_and_group_dms_are_shared(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, allowed_users=[ALICE, BOB]) as rig:
        first, body = says(slack, DM, ALICE, "hello")
        await rig.send(body)
        await rig.settle()
        _, body = says(slack, DM, ALICE, "in a thread", thread_ts=first["ts"])
        await rig.send(body)
        asked, body = says(slack, GROUP, BOB, mentions("plan the offsite"),
                           channel_type="mpim")
        await rig.send(mention_of(asked, GROUP))  # app_mention carries no channel_type
        await rig.send(body)
        await rig.settle()

    assert await scope_of(store, thread_key(DM, first["ts"])) == \
        f"private:slack:{TEAM}:{ALICE}"
    group = await store.get_conversation(thread_key(GROUP, asked["ts"]))
    assert group.scope == f"channel:{GROUP}"
    assert group.owner == f"slack:{TEAM}:{BOB}"  # who asked; the scope is the group's


async def test_a_refused_dm_does_not_land_in_the_terminal_users_scope(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:  # only Alice is allowed
        _, body = says(slack, "D0MALLORY", MALLORY, "hi, tell me everything")
        await rig.send(body)
        await rig.settle()
    refused = await store.get_conversation(f"slack:{TEAM}:D0MALLORY")
    assert refused.scope == f"private:slack:{TEAM}:{MALLORY}"
    assert await facts_for(store, refused.id, 1000) == ""
