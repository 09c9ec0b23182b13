"""Slack's inbound side for tests: Events API bodies as Slack builds them (the message is
also put into the fake server's history, as Slack would have it), and signed HTTP
deliveries to a running connector."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import uuid
from urllib.parse import urlencode

import httpx

from tests.fakes.slack_server import BOT_USER, TEAM, FakeSlack

SIGNING_SECRET = "fake-signing-secret"


def event_id() -> str:
    return "Ev" + uuid.uuid4().hex[:12].upper()


def body_of(event: dict, *, eid: str | None = None) -> dict:
    return {"token": "verification-token", "team_id": TEAM, "api_app_id": "A0FAKE",
            "event": event, "type": "event_callback", "event_id": eid or event_id(),
            "event_time": int(time.time()),
            "authorizations": [{"team_id": TEAM, "user_id": BOT_USER, "is_bot": True}]}


def channel_type_of(channel: str) -> str:
    return {"D": "im", "G": "group"}.get(channel[:1], "channel")


def says(slack: FakeSlack, channel: str, user: str, text: str, *,
         thread_ts: str | None = None, files: list[dict] | None = None,
         bot_id: str | None = None, channel_type: str | None = None,
         ts: str | None = None) -> tuple[dict, dict]:
    """A user (or bot) posts a message: (the stored message, its `message` event body).
    `channel_type` when the id does not tell (a group DM, "mpim", is a G… id too); `ts`
    to date it (else the workspace's clock gives the next one)."""
    message: dict = {"user": user, "text": text, "team": TEAM}
    if ts:
        message["ts"] = ts
    if thread_ts:
        message["thread_ts"] = thread_ts
    if files:
        message["files"] = files
        message["subtype"] = "file_share"
    if bot_id:
        message["bot_id"] = bot_id
        message["subtype"] = "bot_message"
    stored = slack.add_message(channel, message)
    event = {"type": "message", "channel": channel,
             "channel_type": channel_type or channel_type_of(channel),
             "event_ts": stored["ts"], **stored}
    return stored, body_of(event)


def mention_of(message: dict, channel: str) -> dict:
    """The `app_mention` event Slack sends for a message that mentions the bot."""
    event = {k: v for k, v in message.items() if k not in ("subtype", "reply_count")}
    event.update(type="app_mention", channel=channel, event_ts=message["ts"])
    return body_of(event)


def mentions(text: str) -> str:
    return f"<@{BOT_USER}> {text}"


def edited(slack: FakeSlack, channel: str, ts: str, text: str) -> dict:
    previous, new = slack.edit_message(channel, ts, text)
    return body_of({"type": "message", "subtype": "message_changed", "hidden": True,
                    "channel": channel, "channel_type": channel_type_of(channel),
                    "ts": new["edited"]["ts"], "event_ts": new["edited"]["ts"],
                    "message": new, "previous_message": previous})


def deleted(slack: FakeSlack, channel: str, ts: str) -> dict:
    previous = slack.delete_message(channel, ts)
    now = slack.next_ts()
    return body_of({"type": "message", "subtype": "message_deleted", "hidden": True,
                    "channel": channel, "channel_type": channel_type_of(channel), "ts": now,
                    "event_ts": now, "deleted_ts": ts, "previous_message": previous})


def tombstoned(slack: FakeSlack, channel: str, ts: str) -> dict:
    """A message with replies (a thread's parent) deleted: Slack keeps a tombstone in its
    place and says so with a `message_changed`, not a `message_deleted`."""
    previous, tombstone = slack.tombstone_message(channel, ts)
    now = slack.next_ts()
    return body_of({"type": "message", "subtype": "message_changed", "hidden": True,
                    "channel": channel, "channel_type": channel_type_of(channel), "ts": now,
                    "event_ts": now, "message": tombstone, "previous_message": previous})


def signed_headers(body: str, *, secret: str = SIGNING_SECRET,
                   timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hmac.new(secret.encode(), f"v0:{ts}:{body}".encode(), hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": f"v0={digest}",
            "Content-Type": "application/json"}


async def deliver(http: httpx.AsyncClient, url: str, body: dict, *,
                  secret: str = SIGNING_SECRET, timestamp: int | None = None,
                  retry_num: int | None = None) -> tuple[int, float]:
    """POST an event to the connector as Slack does: (status, seconds until answered)."""
    raw = json.dumps(body)
    headers = signed_headers(raw, secret=secret, timestamp=timestamp)
    if retry_num is not None:
        headers["X-Slack-Retry-Num"] = str(retry_num)
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    started = time.perf_counter()
    response = await http.post(url, content=raw, headers=headers)
    return response.status_code, time.perf_counter() - started


def clicked(channel: str, message: dict, user: str, action_id: str) -> dict:
    """The `block_actions` payload Slack sends when `user` presses the button `action_id`
    on `message` (a bot message with blocks, as the fake stores it)."""
    buttons = [e for b in message.get("blocks") or [] if b.get("type") == "actions"
               for e in b["elements"]]
    [button] = [b for b in buttons if b["action_id"] == action_id]
    return {"type": "block_actions", "user": {"id": user, "team_id": TEAM},
            "api_app_id": "A0FAKE", "token": "verification-token",
            "container": {"type": "message", "message_ts": message["ts"],
                          "channel_id": channel, "is_ephemeral": False},
            "trigger_id": uuid.uuid4().hex, "team": {"id": TEAM, "domain": "fake"},
            "channel": {"id": channel}, "message": message,
            "response_url": "https://hooks.slack.test/actions/x",
            "actions": [{**button, "block_id": "steward.approval",
                         "action_ts": f"{time.time():.6f}"}]}


async def interact(http: httpx.AsyncClient, url: str, payload: dict, *,
                   secret: str = SIGNING_SECRET) -> int:
    """POST an interaction as Slack does (a signed form with one field, `payload`)."""
    raw = urlencode({"payload": json.dumps(payload)})
    headers = {**signed_headers(raw, secret=secret),
               "Content-Type": "application/x-www-form-urlencoded"}
    return (await http.post(url, content=raw, headers=headers)).status_code
