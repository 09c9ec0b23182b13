"""Socket Mode end to end: the connector opens the fake's websocket (apps.connections.open),
acknowledges envelopes once they are journaled, survives a reconnect, and answers an
envelope Slack sends again (its ack lost) only once."""

import asyncio
import time

import pytest

from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig

DM = "D0ALICE"
ALICE = "U0ALICE"


async def wait_for(check, within: float = 10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_socket_mode_end_to_end(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, mode="socket") as rig:
        await wait_for(slack.connected)
        _, body = says(slack, DM, ALICE, "over the socket")
        envelope = slack.push(body)
        await wait_for(lambda: slack.acked(envelope))
        await rig.settle()
        # Slack sends an envelope again when it missed the ack: answered once all the same
        again = slack.push(body, retry_attempt=1)
        await wait_for(lambda: slack.acked(again))
        await rig.settle()

        slack.disconnect_sockets()  # Slack asks for a reconnect now and then
        await wait_for(lambda: slack.socket.connects >= 2 and slack.connected())
        _, later = says(slack, DM, ALICE, "after the reconnect")
        envelope = slack.push(later)
        await wait_for(lambda: slack.acked(envelope))
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == [
        "echo: over the socket", "echo: after the reconnect"]
    assert slack.count("apps.connections.open") >= 2
