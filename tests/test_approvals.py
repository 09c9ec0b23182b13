"""Approvals as durable waits, with a real `steward` and the fake LLM server: an unsafe
custom tool waits for the person's yes; the wait survives SIGKILL at every step; an answer
is applied once; no (or no answer in time) means it never runs."""

import asyncio
import json
import re
import signal

import pytest

from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, ToolCall
from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.fakes.slack_events import mention_of, mentions, says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import TEAM, FakeSlack
from tests.test_crash_agent import make_home, steward

SESSION = "cli:pay"
CODE = re.compile(r"yes ([0-9a-f]{8})")


def script(request: dict, _wire: str) -> Reply:
    last = request["messages"][-1]
    if last["role"] == "tool":
        return Reply(text=f"Done: {last['content']}")
    if "pay the plumber" in last["content"]:
        return Reply(text="", tool_calls=[("call_1", "unsafe_charge", {"amount": 42})])
    return Reply(text=f"echo: {last['content']}")


@pytest.fixture
def llm():
    with FakeLLMServer(script) as server:
        yield server


def home_for(tmp_path, store_url, llm, **agent) -> object:
    home = make_home(tmp_path, store_url, llm.url, "openai")
    config = home / "config.toml"
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in agent.items())
    config.write_text(config.read_text().replace(
        "approve_unsafe_custom_tools = false", "approve_unsafe_custom_tools = true\n" + extra))
    return home


def runs(home) -> int:
    path = home / "ledger"
    return path.read_text().count("unsafe_charge") if path.exists() else 0


async def finals(home) -> list[str]:
    code, out, err = await steward(home, "log", SESSION, "--json", "--limit", "100")
    assert code == 0, err
    return [e["text"] for e in map(json.loads, out.splitlines())
            if e["kind"] == "assistant" and (e["data"] or {}).get("final")]


async def asked(home) -> str:
    """Ask for the payment; the request for approval is shown and `ask` returns."""
    code, out, err = await steward(home, "ask", "--session", SESSION, "pay the plumber")
    assert code == 0, err[-3000:]
    assert "Approval needed: may I run the tool unsafe_charge (amount=42)?" in out, out
    assert "[waiting for your approval" in out
    assert runs(home) == 0
    return CODE.search(out).group(1)


async def test_yes_runs_the_call_once_and_the_model_is_told(store_url, tmp_path, llm):
    home = home_for(tmp_path, store_url, llm)
    code = await asked(home)
    status, out, err = await steward(home, "ask", "--session", SESSION, f"yes {code}")
    assert status == 0, err[-3000:]
    assert "[approved]" in out and "Done: charged 42" in out, out
    assert runs(home) == 1
    # The same answer again (a double click, a retry): an ordinary message now.
    status, out, _ = await steward(home, "ask", "--session", SESSION, f"yes {code}")
    assert status == 0 and f"echo: yes {code}" in out and runs(home) == 1
    assert await finals(home) == ["Done: charged 42", f"echo: yes {code}"]


async def test_no_means_never(store_url, tmp_path, llm):
    home = home_for(tmp_path, store_url, llm)
    code = await asked(home)
    status, out, _ = await steward(home, "ask", "--session", SESSION, f"NO {code}")
    assert status == 0 and "[denied]" in out and "the person refused it" in out, out
    assert runs(home) == 0
    assert await finals(home) == ["Done: error: not run: the person refused it"]


async def test_silence_means_never_too(store_url, tmp_path, llm):
    home = home_for(tmp_path, store_url, llm, approval_expiry_minutes=0.1)
    code = await asked(home)
    await asyncio.sleep(6.5)  # past the expiry (6 s)
    status, out, _ = await steward(home, "resume")
    assert status == 0, out
    assert runs(home) == 0
    assert await finals(home) == ["Done: error: not run: the person did not approve it in "
                                  "time (the request expired)"]
    status, out, _ = await steward(home, "ask", "--session", SESSION, f"yes {code}")
    assert runs(home) == 0 and f"echo: yes {code}" in out  # too late: nothing to approve


# (where the kill lands, which command it kills, tool runs after all, interrupted)
KILLS = [
    ("after-result:deliver", "ask", 1, False),  # the request was shown, not recorded
    ("after-phase:approval.ran", "yes", 1, False),  # yes applied, the call spawned
    ("in-tool:unsafe_charge", "yes", 1, True),  # the approved call cut off mid-effect
    ("after-result:tool_call", "yes", 1, False),  # it ran; the turn had not seen it
]


@pytest.mark.parametrize(("point", "killed", "ran", "interrupted"), KILLS)
async def test_the_wait_and_the_yes_survive_sigkill(store_url, tmp_path, llm, point, killed,
                                                    ran, interrupted):
    home = home_for(tmp_path, store_url, llm)
    if killed == "ask":
        status, shown, err = await steward(home, "ask", "--session", SESSION,
                                           "pay the plumber", kill_at=point)
        assert status == -signal.SIGKILL, err[-2000:]
        status, out, err = await steward(home, "resume")
        assert status == 0, err[-3000:]
        assert runs(home) == 0 and CODE.search(out) is None  # not asked twice
        code = CODE.search(shown).group(1)  # shown once, before the kill
        status, out, err = await steward(home, "ask", "--session", SESSION, f"yes {code}")
    else:
        code = await asked(home)
        status, _, err = await steward(home, "ask", "--session", SESSION, f"yes {code}",
                                       kill_at=point)
        assert status == -signal.SIGKILL, err[-2000:]
        status, out, err = await steward(home, "resume")
    assert status == 0, err[-3000:]
    assert runs(home) == ran
    told = await finals(home)
    assert len(told) == 1, told
    assert ("interrupted" in told[0]) if interrupted else told[0] == "Done: charged 42"
    _, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
    tasks = [json.loads(line) for line in out.splitlines()]
    requests = [t for t in tasks if t["kind"] == "deliver"]
    assert len(requests) == 2  # the request, once, and the answer
    assert [t["state"] for t in tasks if t["kind"] == "approval"] == ["done"]


@pytest.mark.parametrize("point", [
    "in-phase:approval.waiting",  # the no is recorded; the wait was cut off applying it
    "after-result:approval",  # the refusal is the approval's result; the turn had not seen it
])
async def test_a_no_survives_sigkill_and_the_call_never_runs(store_url, tmp_path, llm, point):
    home = home_for(tmp_path, store_url, llm)
    code = await asked(home)
    status, _, err = await steward(home, "ask", "--session", SESSION, f"no {code}",
                                   kill_at=point)
    assert status == -signal.SIGKILL, err[-2000:]
    status, _, err = await steward(home, "resume")
    assert status == 0, err[-3000:]
    assert runs(home) == 0
    assert await finals(home) == ["Done: error: not run: the person refused it"]
    _, out, _ = await steward(home, "tasks", "--json", "--limit", "100")
    tasks = [json.loads(line) for line in out.splitlines()]
    assert [t["state"] for t in tasks if t["kind"] == "approval"] == ["done"]
    assert [t for t in tasks if t["kind"] == "tool_call"] == []
    # A yes after the no changes nothing: an ordinary message.
    status, out, _ = await steward(home, "ask", "--session", SESSION, f"yes {code}")
    assert status == 0 and f"echo: yes {code}" in out and runs(home) == 0


def todo_script(request) -> Response:
    last = request.messages[-1]
    if last.role == "tool":
        return Response(text=f"Tool said: {last.content}")
    if last.content.startswith("add "):
        return Response(text="", tool_calls=[ToolCall(id="t1", name="todo", arguments={
            "action": "add", "item": last.content[4:]})])
    return Response(text=f"echo: {last.content}")


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_in_slack_only_the_asker_can_approve(store, tmp_path):
    with FakeSlack() as slack:
        slack.add_user("U0ALICE", "Alice")
        slack.add_user("U0BOB", "Bob")
        async with SlackRig(store, tmp_path, slack, client=ScriptedModel(todo_script),
                            allowed_users=["U0ALICE", "U0BOB"],
                            agent={"approval_tools": ["todo"]}) as rig:
            _, body = says(slack, "D0ALICE", "U0ALICE", "add milk")
            await rig.send(body)
            await shown(slack, "D0ALICE", 1)
            [request] = slack.bot_messages("D0ALICE")
            code = re.search(r"`yes ([0-9a-f]{8})`", request["text"]).group(1)
            assert request["text"].startswith("Approval needed: may I run the tool todo")
            # Bob, in his own DM, cannot approve Alice's request.
            _, body = says(slack, "D0BOB", "U0BOB", f"yes {code}")
            await rig.send(body)
            await shown(slack, "D0BOB", 1)
            assert [m["text"] for m in slack.bot_messages("D0BOB")] == [f"echo: yes {code}"]
            assert len(slack.bot_messages("D0ALICE")) == 1
            _, body = says(slack, "D0ALICE", "U0ALICE", f"yes {code}")
            await rig.send(body)
            await rig.send(body, retry_num=1)  # Slack's retry of the same event: nothing
            await rig.settle(10)
        texts = [m["text"] for m in slack.bot_messages("D0ALICE")]
        assert len(texts) == 2 and texts[1].startswith("Tool said: ") and "milk" in texts[1]


async def shown(slack, channel: str, count: int, within: float = 10.0) -> None:
    for _ in range(int(within / 0.05)):
        if len(slack.bot_messages(channel)) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{channel} shows {slack.bot_messages(channel)}")


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_in_a_shared_thread_the_approval_is_for_whoever_asked(store, tmp_path):
    """Alice opened the thread; Bob asks in it. Bob's request waits for Bob's yes, not the
    thread owner's."""
    with FakeSlack() as slack:
        slack.add_user("U0ALICE", "Alice")
        slack.add_user("U0BOB", "Bob")
        async with SlackRig(store, tmp_path, slack, client=ScriptedModel(todo_script),
                            allowed_users=["U0ALICE", "U0BOB"],
                            agent={"approval_tools": ["todo"]}) as rig:
            top, _ = says(slack, "C0GENERAL", "U0ALICE", mentions("hello"))
            await rig.send(mention_of(top, "C0GENERAL"))
            await shown(slack, "C0GENERAL", 1)
            _, body = says(slack, "C0GENERAL", "U0BOB", "add eggs", thread_ts=top["ts"])
            await rig.send(body)
            await shown(slack, "C0GENERAL", 2)
            request = slack.bot_messages("C0GENERAL")[1]
            assert request["text"].startswith("Approval needed: may I run the tool todo")
            code = re.search(r"`yes ([0-9a-f]{8})`", request["text"]).group(1)
            [waiting] = await store.list_tasks(kind="approval")
            assert waiting.inputs["who"] == f"slack:{TEAM}:U0BOB"
            # The thread's owner cannot approve Bob's request: an ordinary message (queued
            # behind Bob's turn, answered once that is done).
            _, body = says(slack, "C0GENERAL", "U0ALICE", f"yes {code}", thread_ts=top["ts"])
            await rig.send(body)
            await asyncio.sleep(1.0)
            assert (await store.get_task(waiting.id)).state != "done"
            assert len(slack.bot_messages("C0GENERAL")) == 2
            _, body = says(slack, "C0GENERAL", "U0BOB", f"yes {code}", thread_ts=top["ts"])
            await rig.send(body)
            await shown(slack, "C0GENERAL", 4)
            await rig.settle()
        texts = [m["text"] for m in slack.bot_messages("C0GENERAL")]
        assert len(texts) == 4, texts
        assert texts[2].startswith("Tool said: ") and "eggs" in texts[2]
        assert texts[3] == f"echo: yes {code}"
