"""Approve / Deny buttons on an approval request, and the clicks on them.

A request for approval (bot/agent/approval.py) is posted with two buttons under its text;
the text keeps the typed way (`yes CODE`) for clients that show no buttons. A click
reaches Steward as a signed `block_actions` payload, on the events endpoint in HTTP mode
or as an `interactive` envelope in Socket Mode, and goes through the same `answer()` as a
typed yes: only the person the request went to, once, while it waits.

Slack never sends an interaction again, and a click it got no ack for is shown to the
person as failed, buttons still in place. So a click is applied before its ack (one keyed
commit; a few milliseconds): an acked click is never lost, an unacked one is clicked again,
and a second application is a no-op. Afterwards, not in the ack's way, the request's
buttons are replaced by what became of it; one who may not answer is told so privately.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from typing import Any

from bot.port import AgentPort

from .events import Fields, Identity
from .web import SlackWeb

log = logging.getLogger(__name__)

APPROVE, DENY = "steward.approve", "steward.deny"  # the buttons' action ids
BLOCK = "steward.approval"
_APPROVAL_ID = re.compile(r"[A-Za-z0-9]{1,64}")  # a task id, as the button's value

# What a request says once it is no longer waiting; {who}: who answered it.
APPROVED, REFUSED = ":white_check_mark: Approved by {who}.", ":no_entry: Refused by {who}."
UNANSWERED = {"expired": "This request expired unanswered, so it was refused.",
              "unknown": "This request is not known here any more."}
NOT_YOURS = "Only the person who asked can answer this request."


def approval_blocks(text: str, approval_id: str) -> list[dict[str, Any]]:
    """The request's text (already Slack mrkdwn) with Approve and Deny under it."""
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "actions", "block_id": BLOCK, "elements": [
            {"type": "button", "action_id": APPROVE, "style": "primary", "value": approval_id,
             "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": DENY, "style": "danger", "value": approval_id,
             "text": {"type": "plain_text", "text": "Deny"}}]},
    ]


def answered_blocks(text: str, outcome: str) -> list[dict[str, Any]]:
    """The request as it stays once answered: its text, and what became of it."""
    return [{"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": outcome}]}]


def named(by: str) -> str:
    """Who answered, as Slack shows a person: a mention for a Slack user."""
    return f"<@{by.rsplit(':', 1)[1]}>" if by.startswith("slack:") else by or "someone"


@dataclass(frozen=True)
class Click:
    team: str
    user: str
    approval_id: str
    approved: bool
    channel: str  # where the request is shown (empty if Slack did not say)
    message_ts: str | None
    text: str  # the request's text as shown, to keep when its buttons go

    @property
    def by(self) -> str:
        """The clicker as conversations name their owner (see routing.owner)."""
        return f"slack:{self.team}:{self.user}"


def parse_click(body: dict, me: Identity) -> Click | None:
    """The click on one of Steward's approval buttons in a `block_actions` payload; None for
    any other interaction. Raises `Malformed` when a field it reads is not what Slack sends."""
    payload = Fields(body, "payload")
    actions = payload.obj.get("actions")
    if not isinstance(actions, list) or not actions:
        return None
    action = Fields(actions[0], "payload.actions[0]")
    action_id = action.name("action_id")
    if action_id not in (APPROVE, DENY):
        return None
    value = action.text("value")
    if not _APPROVAL_ID.fullmatch(value):
        raise action._bad("value", "an approval's id")
    user = payload.object("user")
    message = payload.object("message")
    container = payload.object("container")
    team = payload.object("team").id("id") or user.id("team_id") or me.team
    channel = payload.object("channel").id("id") or container.id("channel_id")
    return Click(team=team, user=user.id("id", required=True), approval_id=value,
                 approved=action_id == APPROVE, channel=channel,
                 message_ts=container.ts("message_ts") or message.ts("ts"),
                 text=_section_text(message.obj.get("blocks")) or message.text("text"))


def _section_text(blocks: Any) -> str:
    if isinstance(blocks, list) and blocks and isinstance(blocks[0], dict):
        text = blocks[0].get("text")
        if isinstance(text, dict) and isinstance(text.get("text"), str):
            return text["text"]
    return ""


class Clicks:
    """Applies clicks on the agent's loop; tells Slack what became of them afterwards."""

    def __init__(self, port: AgentPort, web: SlackWeb):
        self.port = port
        self.web = web
        self._showing: set[asyncio.Task] = set()

    async def take(self, click: Click) -> str:
        """Apply the click (committed when this returns) and begin showing the outcome."""
        outcome = await self.port.answer_approval(click.approval_id, click.approved,
                                                  by=click.by)
        log.info("slack: %s clicked %s on approval %s: %s", click.user,
                 "approve" if click.approved else "deny", click.approval_id, outcome)
        task = asyncio.create_task(self._show(click, outcome))
        self._showing.add(task)
        task.add_done_callback(self._showing.discard)
        return outcome

    async def _show(self, click: Click, outcome: str) -> None:
        try:
            if outcome == "not yours":
                if click.channel:
                    await self.web.call("chat_postEphemeral", channel=click.channel,
                                        user=click.user, text=NOT_YOURS)
                return
            if not (click.channel and click.message_ts):
                return
            found = await self.port.approval_answer(click.approval_id)
            if found is not None:  # the stored answer, whichever click or reply gave it
                shown = (APPROVED if found[0] else REFUSED).format(who=named(found[1]))
            else:
                shown = UNANSWERED.get(outcome, UNANSWERED["unknown"])
            # The text stays as it was posted: a restarted delivery compares it.
            await self.web.call("chat_update", channel=click.channel, ts=click.message_ts,
                                text=click.text, blocks=answered_blocks(click.text, shown))
        except Exception as exc:  # noqa: BLE001 - the answer is applied; this is cosmetic
            log.warning("slack: showing the answer to approval %s failed: %s",
                        click.approval_id, exc)

    @property
    def busy(self) -> int:
        """Outcomes still being shown."""
        return len(self._showing)

    async def stop(self, grace: float) -> None:
        if self._showing:
            await asyncio.wait(set(self._showing), timeout=grace)
