"""The Slack channel the delivery task calls: `send` shows an answer (editing the streamed
message under the same key, posting only parts that do not exist yet), `find` tells a
restarted delivery whether Slack already shows it in full.

An answer to a message the user deleted before it was answered is not shown: whatever was
streamed of it is deleted, and the delivery is recorded as skipped.

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

from bot.channels import Outbound
from bot.runtime import Unavailable
from bot.runtime.killpoints import kill_point
from store import Store

from . import faults
from .messages import Messages, part_key
from .mrkdwn import render
from .streaming import Streams
from .working import Working

log = logging.getLogger(__name__)

HISTORY_CHANNEL = "slack:history"  # where bot.agent.inbox.add_history records its refs


def deleted_ref(channel: str, ts: str) -> str:
    """The history ref under which the deletion of a user's message is recorded."""
    return f"deleted:{channel}:{ts}"


class SlackChannel:
    name = "slack"

    def __init__(self, messages: Messages, streams: Streams, working: Working, store: Store):
        self.messages = messages
        self.streams = streams
        self.working = working
        self.store = store

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

    async def _send(self, message: Outbound) -> dict[str, Any]:
        where = message.reply_to
        parts = render(message.text)
        self.streams.finish(message.key)
        async with self.messages.locked(message.key):
            if await self._withdrawn(where):
                removed = await self.messages.remove(message.key, where)
                result: dict[str, Any] = {"skipped": "the question was deleted",
                                          "removed": removed}
            else:
                await self.streams.pace(message.key)
                shown = await self.messages.write(message.key, where, parts)
                result = {"channel": shown[0].channel, "ts": shown[0].ts,
                          "parts": [p.ts for p in shown]}
        kill_point("slack-sent", "slack")
        await self._clear_sign(message)
        return result

    async def _clear_sign(self, message: Outbound) -> None:
        try:
            await self.working.done(message)
        except Exception:  # noqa: BLE001 - the answer is shown; the sign is cosmetic
            log.exception("slack: clearing the working sign failed")

    async def _find(self, message: Outbound) -> dict[str, Any] | None:
        where = message.reply_to
        parts = render(message.text)
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
        if await self._withdrawn(where) and not shown:
            return {"skipped": "the question was deleted", "found": True}
        return None  # missing or unfinished: `send` completes it without posting twice

    async def _withdrawn(self, where: dict[str, Any]) -> bool:
        if not where.get("message_ts"):
            return False
        ref = deleted_ref(where["channel"], where["message_ts"])
        return await self.store.submission_state(HISTORY_CHANNEL, ref) is not None
