"""The Slack channel the delivery task calls: `send` shows an answer (editing the streamed
message under the same key, posting only parts that do not exist yet), `find` tells a
restarted delivery whether Slack already shows it in full (or, in a home restored from a
backup, that other answers cover every message it answers: then what it streamed itself is
deleted).

An answer to a message the user deleted before it was answered is not shown (the delivery
task decides, by `withdrawal_ref`); `retract` deletes whatever was streamed of it.

When Slack is unreachable or in trouble (faults.py) the delivery says so in the runtime's
terms, so that it is retried for `outage_attempts` rather than failed: `send` raises
`NotPerformed` if nothing it did can have changed what Slack shows (the connection was
refused, a 429, or only a read failed), else `Unavailable`; `find` raises `Unavailable`.
Either way the next try looks for the answer's messages by key before posting, and edits
a half-streamed message (" …") into the final text.
"""

from __future__ import annotations

import logging
from typing import Any

from bot.port import Channel, Outbound, Unavailable
from bot.runtime.killpoints import kill_point

from . import faults
from .actions import approval_blocks
from .messages import Messages, part_key
from .mrkdwn import render
from .routing import deleted_ref
from .streaming import Streams
from .working import Working

log = logging.getLogger(__name__)

class SlackChannel(Channel):
    name = "slack"
    shows_progress = True  # the "working on it" sign on every message an answer covers

    def __init__(self, messages: Messages, streams: Streams, working: Working,
                 *, allow_broadcast: bool = False):
        self.allow_broadcast = allow_broadcast  # [slack] allow_broadcast_mentions
        self.messages = messages
        self.streams = streams
        self.working = working

    def how_to_approve(self, code: str) -> str:
        return f"Press Approve or Deny, or reply `yes {code}` or `no {code}`"

    def direct_to(self, where: dict[str, Any]) -> dict[str, Any] | None:
        """A direct message to the person who wrote from `where`: posting to a user id
        lands in the bot's DM with them."""
        if not where.get("user"):
            return None
        return {"team": where.get("team"), "channel": where["user"], "user": where["user"]}

    def withdrawal_ref(self, where: dict[str, Any]) -> str | None:
        """Where the deletion of the message an answer replies to is recorded (inbound)."""
        if not where.get("message_ts"):
            return None
        return deleted_ref(where["channel"], where["message_ts"])

    async def send(self, message: Outbound) -> dict[str, Any]:
        with self.messages.watch() as touched:
            try:
                return await self._send(message)
            except Exception as exc:
                if not faults.is_outage(exc):
                    raise
                log.warning("slack: delivering %s: %s", message.key, faults.describe(exc))
                raise faults.for_runtime(exc, maybe_shown=touched.maybe) from exc

    async def find(self, message: Outbound) -> dict[str, Any] | None:
        try:
            return await self._find(message)
        except Exception as exc:
            if not faults.is_outage(exc):
                raise
            log.warning("slack: looking for %s: %s", message.key, faults.describe(exc))
            raise Unavailable(f"Slack unavailable, cannot look for the answer: "
                              f"{faults.describe(exc)}") from exc

    async def retract(self, message: Outbound) -> dict[str, Any]:
        """Delete what was streamed of an answer whose question was deleted."""
        with self.messages.watch() as touched:
            try:
                removed = await self._take_back(message)
            except Exception as exc:
                if not faults.is_outage(exc):
                    raise
                log.warning("slack: retracting %s: %s", message.key, faults.describe(exc))
                raise faults.for_runtime(exc, maybe_shown=touched.maybe) from exc
        await self._clear_sign(message)
        return {"removed": removed}

    async def _take_back(self, message: Outbound) -> int:
        """Delete every part of the answer Slack shows; no stream edit comes after."""
        self.streams.finish(message.key)
        async with self.messages.locked(message.key):
            return await self.messages.remove(message.key, message.reply_to)

    async def _send(self, message: Outbound) -> dict[str, Any]:
        where = message.reply_to
        parts = render(message.text, allow_broadcast=self.allow_broadcast)
        self.streams.finish(message.key)
        async with self.messages.locked(message.key):
            await self.streams.pace(message.key)
            shown = await self.messages.write(message.key, where, parts,
                                              self._layout(message, parts), _answers(message))
        kill_point("slack-sent", "slack")
        await self._clear_sign(message)
        return {"channel": shown[0].channel, "ts": shown[0].ts,
                "parts": [p.ts for p in shown]}

    @staticmethod
    def _layout(message: Outbound, parts: list[str]) -> list[dict] | None:
        """Blocks for a message that needs them: a request for approval gets its buttons."""
        if message.approval and len(parts) == 1:
            return approval_blocks(parts[0], message.approval["id"])
        return None

    async def _clear_sign(self, message: Outbound) -> None:
        try:
            await self.working.done(message)
        except Exception:  # noqa: BLE001 - the answer is shown; the sign is cosmetic
            log.exception("slack: clearing the working sign failed")

    async def _find(self, message: Outbound) -> dict[str, Any] | None:
        where = message.reply_to
        parts = render(message.text, allow_broadcast=self.allow_broadcast)
        shown = []
        for i, text in enumerate(parts):
            found = await self.messages.find(part_key(message.key, i), where)
            if found is None or found.text != text:
                break
            shown.append(found)
        else:
            await self._clear_sign(message)  # a restarted delivery: the sign may be left
            return {"channel": shown[0].channel, "ts": shown[0].ts,
                    "parts": [p.ts for p in shown], "found": True}
        covered = _covered(message)
        if not shown and covered and self.messages.answered(
                (await self.messages.resolve(where))["channel"], covered, besides=message.key):
            # Every message it answers has an answer already, under other keys: a home
            # restored from a backup, whose predecessor grouped them otherwise. What it
            # streamed of its own before the snapshot would hang under the real answer.
            removed = await self._take_back(message)
            await self._clear_sign(message)
            return {"found": True, "answered_by_others": list(covered), "removed": removed}
        return None  # missing or unfinished: `send` completes it without posting twice


def _covered(message: Outbound) -> tuple[str, ...]:
    """The ts of the messages an answer covers."""
    return tuple(str(d["slack"]["ts"]) for d in message.covers
                 if isinstance(d.get("slack"), dict) and d["slack"].get("ts"))


def _answers(message: Outbound) -> tuple[str, ...]:
    """The ts of the messages an answer covers, when it covers more than one (follow-ups
    queued behind the first): kept in its metadata (messages.answered_by)."""
    ts = _covered(message)
    return ts if len(ts) > 1 else ()
