"""The "working on it" sign: an :hourglass_flowing_sand: reaction on the user's message from
the moment it is accepted until its answer is delivered (the streamed answer itself shows
progress once text flows; the reaction covers tool rounds and the wait before the first
word). When one answer covers several queued messages, every one of them is cleared (the
delivery says which: `Outbound.covers`). Best effort: a failed
reaction call is logged, never a reason to fail an answer."""

from __future__ import annotations

import logging
from typing import Any

from slack_sdk.errors import SlackApiError

from bot.port import Outbound

from .web import SlackWeb

log = logging.getLogger(__name__)

REACTION = "hourglass_flowing_sand"
HARMLESS = {"already_reacted", "no_reaction", "message_not_found", "channel_not_found"}


class Working:
    def __init__(self, web: SlackWeb):
        self.web = web

    async def start(self, where: dict[str, Any]) -> None:
        await self._react("reactions_add", where["channel"], where["message_ts"])

    async def done(self, message: Outbound) -> None:
        where = message.reply_to
        channel = where.get("channel")
        if not channel or not message.key.endswith(".answer"):
            return  # not an answer (a refusal): no sign was put up
        stamps = {where.get("message_ts")} | {(d.get("slack") or {}).get("ts")
                                               for d in message.covers}
        for ts in sorted(s for s in stamps if s):
            await self._react("reactions_remove", channel, ts)

    async def _react(self, method: str, channel: str, ts: str) -> None:
        try:
            await self.web.call(method, channel=channel, timestamp=ts, name=REACTION)
        except SlackApiError as exc:
            if exc.response.get("error") not in HARMLESS:
                log.warning("slack: %s on %s/%s: %s", method, channel, ts, exc)
        except Exception as exc:  # noqa: BLE001 - a sign, not a duty
            log.warning("slack: %s on %s/%s: %s", method, channel, ts, exc)
