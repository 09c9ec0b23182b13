"""Approvals as Slack buttons: a request is posted with Approve and Deny; a signed click
(`block_actions`, on the events endpoint in HTTP mode, an `interactive` envelope in Socket
Mode) is applied once, only when the person the request went to clicks, and before its
ack; the buttons then give way to what became of the request. A real `steward run` killed
between applying a click and acking it ran the approved call once, and the click Slack
showed as failed, pressed again, changes nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from bot.llm.scripted import ScriptedModel
from connectors.slack.actions import APPROVE, DENY, NOT_YOURS
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.slack_events import clicked, deliver, interact, says, signed_headers
from tests.fakes.slack_rig import SlackRig, free_port
from tests.fakes.slack_server import FakeSlack
from tests.test_approvals import script as charge_script
from tests.test_approvals import todo_script
from tests.test_slack_crash import make_home as crash_home
from tests.test_slack_crash import start as crash_start
from tests.test_slack_socket_mode import wait_for

ALICE, BOB = "U0ALICE", "U0BOB"
DM = "D0ALICE"
TESTS = Path(__file__).parent


SLACK_PEOPLE = ((ALICE, "Alice"), (BOB, "Bob"))  # the `slack` fixture's workspace


def rig(store, tmp_path, slack, **config) -> SlackRig:
    return SlackRig(store, tmp_path, slack, client=ScriptedModel(todo_script),
                    allowed_users=[ALICE, BOB], agent={"approval_tools": ["todo"]}, **config)


async def shown(slack: FakeSlack, count: int, within: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if len(messages := slack.bot_messages(DM)) >= count:
            return messages
        await asyncio.sleep(0.05)
    raise AssertionError(f"the DM shows {slack.bot_messages(DM)}")


def buttons(message: dict) -> list[str]:
    return [e["action_id"] for b in message.get("blocks") or [] if b["type"] == "actions"
            for e in b["elements"]]


def outcome_line(message: dict) -> str:
    return " ".join(e["text"] for b in message.get("blocks") or [] if b["type"] == "context"
                    for e in b["elements"])


async def requested(rig: SlackRig, slack: FakeSlack) -> dict:
    _, body = says(slack, DM, ALICE, "add milk")
    await rig.send(body)
    [request] = await shown(slack, 1)
    assert request["text"].startswith("Approval needed: may I run the tool todo")
    assert buttons(request) == [APPROVE, DENY]
    return request


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_approve_is_applied_once_and_only_for_the_asker(store, tmp_path, slack):
    async with rig(store, tmp_path, slack) as r:
        request = await requested(r, slack)
        # Bob is allowed to talk to Steward, but the request is Alice's.
        assert await interact(r.http, r.events_url, clicked(DM, request, BOB, APPROVE)) == 200
        await wait_for(lambda: slack.ephemeral)
        assert slack.ephemeral == [{"channel": DM, "user": BOB, "text": NOT_YOURS}]
        assert len(slack.bot_messages(DM)) == 1 and buttons(slack.bot_messages(DM)[0])

        click = clicked(DM, request, ALICE, APPROVE)
        assert await interact(r.http, r.events_url, click) == 200
        assert await interact(r.http, r.events_url, click) == 200  # a double click
        await r.settle()
        messages = await shown(slack, 2)
        assert await interact(r.http, r.events_url, clicked(DM, request, ALICE, DENY)) == 200
        await r.settle()
    request, answer = slack.bot_messages(DM)
    assert answer["text"].startswith("Tool said: ") and "milk" in answer["text"]
    assert buttons(request) == []
    assert outcome_line(request) == f":white_check_mark: Approved by <@{ALICE}>."
    assert request["text"] == messages[0]["text"]  # the fallback text is left as posted
    assert len(slack.bot_messages(DM)) == 2 and len(slack.ephemeral) == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_deny_means_never_and_the_model_is_told(store, tmp_path, slack):
    async with rig(store, tmp_path, slack) as r:
        request = await requested(r, slack)
        assert await interact(r.http, r.events_url, clicked(DM, request, ALICE, DENY)) == 200
        await shown(slack, 2)
        await r.settle()
    request, answer = slack.bot_messages(DM)
    assert answer["text"] == "Tool said: error: not run: the person refused it"
    assert outcome_line(request) == f":no_entry: Refused by <@{ALICE}>."
    assert buttons(request) == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_click_over_socket_mode_is_applied_and_acked(store, tmp_path, slack):
    async with rig(store, tmp_path, slack, mode="socket") as r:
        await wait_for(slack.connected)
        _, body = says(slack, DM, ALICE, "add milk")
        slack.push(body)
        [request] = await shown(slack, 1)
        envelope = slack.push(clicked(DM, request, ALICE, APPROVE), envelope_type="interactive")
        await wait_for(lambda: slack.acked(envelope))
        await shown(slack, 2)
        await r.settle()
    assert "milk" in slack.bot_messages(DM)[1]["text"]
    assert outcome_line(slack.bot_messages(DM)[0]).startswith(":white_check_mark:")


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_clicks_that_are_not_what_slack_sends_change_nothing(store, tmp_path, slack):
    async with rig(store, tmp_path, slack) as r:
        request = await requested(r, slack)
        forged = clicked(DM, request, ALICE, APPROVE)
        forged["actions"][0]["value"] = "../../etc; drop table"
        assert await interact(r.http, r.events_url, forged) == 200  # dropped, not a 500
        no_user = clicked(DM, request, ALICE, APPROVE)
        no_user["user"] = "U0ALICE"
        assert await interact(r.http, r.events_url, no_user) == 200
        other = clicked(DM, request, ALICE, APPROVE)
        other["actions"][0]["action_id"] = "someone.elses.button"
        assert await interact(r.http, r.events_url, other) == 200
        raw = "payload=%7Bnot+json"
        headers = {**signed_headers(raw), "Content-Type": "application/x-www-form-urlencoded"}
        assert (await r.http.post(r.events_url, content=raw, headers=headers)).status_code == 400
        unsigned = clicked(DM, request, ALICE, APPROVE)
        assert await interact(r.http, r.events_url, unsigned, secret="wrong") == 401
        await asyncio.sleep(0.5)  # room for a wrong answer to show up
        assert len(slack.bot_messages(DM)) == 1 and buttons(slack.bot_messages(DM)[0])
        assert await interact(r.http, r.events_url, clicked(DM, request, ALICE, APPROVE)) == 200
        await shown(slack, 2)
        await r.settle()
    assert "milk" in slack.bot_messages(DM)[1]["text"]


# -- a real `steward run`, killed between applying a click and its ack -----------------

def make_home(home: Path, store_url: str, llm_url: str, slack_url: str, port: int) -> None:
    """The Slack crash tests' home, with the crash tests' unsafe tool needing approval."""
    config = crash_home(home, store_url, llm_url, slack_url, port) / "config.toml"
    config.write_text(config.read_text() + '[agent]\ntool_modules = ["crash_tools"]\n'
                      "approve_unsafe_custom_tools = true\n")


async def start(home: Path, port: int, kill_at: str | None = None):
    """`steward run` with the crash tests' tool module and its ledger."""
    return await crash_start(home, port, kill_at, extra_env={
        "STEWARD_TEST_LEDGER": str(home / "ledger"),
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])})


def charges(home: Path) -> int:
    path = home / "ledger"
    return path.read_text().count("unsafe_charge") if path.exists() else 0


async def test_sigkill_between_applying_a_click_and_its_ack(store_url, tmp_path, slack):
    with FakeLLMServer(charge_script) as llm:
        home, port = tmp_path / "home", free_port()
        make_home(home, store_url, llm.url, slack.url, port)
        url = f"http://127.0.0.1:{port}/slack/events"
        first = await start(home, port, kill_at="slack-click-applied:slack")
        async with httpx.AsyncClient(timeout=20) as http:
            _, body = says(slack, DM, ALICE, "pay the plumber")
            assert (await deliver(http, url, body))[0] == 200
            [request] = await shown(slack, 1)
            assert buttons(request) == [APPROVE, DENY] and charges(home) == 0
            click = clicked(DM, request, ALICE, APPROVE)
            with pytest.raises(httpx.HTTPError):  # Slack would show the click as failed
                await interact(http, url, click)
            assert await asyncio.wait_for(first.wait(), 30) == -signal.SIGKILL

            second = await start(home, port)
            try:
                await wait_for(lambda: [m["text"] for m in slack.bot_messages(DM)][1:]
                               == ["Done: charged 42"], within=60)  # streamed, then final
                assert await interact(http, url, click) == 200  # pressed again
                await asyncio.sleep(1.0)  # room for a wrong second run to show up
            finally:
                second.send_signal(signal.SIGTERM)
                log = (await asyncio.wait_for(second.communicate(), 30))[1].decode()
        assert second.returncode == 0, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert charges(home) == 1
    assert [m["text"] for m in slack.bot_messages(DM)][1:] == ["Done: charged 42"]
    assert outcome_line(slack.bot_messages(DM)[0]) == f":white_check_mark: Approved by <@{ALICE}>."
