"""The state of the fake Slack workspace and its Web API methods: channels with their
messages (threads included), files and people, and Steward's DM with each person
(`conversations.open` with users=U... answers its D... id; a person's id given where a
conversation is expected is channel_not_found), and the channels Steward was invited to
(`join`). `users.conversations` lists, as Slack does for a bot token, its DMs (each one
opened or holding a message, with the person's id as `user`) and the channels it is a
member of, by `types`, in cursor pages; a read scope named in `missing_scopes` makes it
answer missing_scope, as Slack does for an app installed without it. `FakeSlack` serves it
over HTTP; this module is plain data and runs under the server's lock."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

TEAM = "T0FAKE"
BOT_USER = "U0STEWARD"
BOT_ID = "B0STEWARD"


class Workspace:
    def __init__(self) -> None:
        self.messages: dict[str, list[dict]] = {}  # channel -> messages in ts order
        self.files: dict[str, tuple[dict, bytes]] = {}
        self.users: dict[str, dict] = {}
        self.dms: dict[str, str] = {}  # user -> the id of Steward's DM with them
        self.joined: dict[str, str] = {}  # channel -> its type: the channels Steward is in
        self.missing_scopes: set[str] = set()  # read scopes the app was installed without
        self.ephemeral: list[dict] = []  # chat.postEphemeral: seen by one user, not kept
        self.port = 0
        # The most messages conversations.history/replies (and the conversations
        # users.conversations lists) give per page, whatever `limit` asks (Slack caps it too:
        # 1000, and 15 for some apps); lower it to see cursors.
        self.page_cap = 1000
        self._tick = 0
        self._base = int(time.time()) - 100_000
        self._lock = threading.RLock()

    def next_ts(self) -> str:
        with self._lock:
            self._tick += 1
            return f"{self._base + self._tick // 1000}.{self._tick % 1000:03d}100"

    def history(self, channel: str) -> list[dict]:
        """Every message of a channel, threads included, oldest first (copies)."""
        with self._lock:
            return [dict(m) for m in self.messages.get(channel, [])]

    def bot_messages(self, channel: str, thread_ts: str | None = None) -> list[dict]:
        return [m for m in self.history(channel) if m.get("bot_id") == BOT_ID
                and (thread_ts is None or m.get("thread_ts") == thread_ts)]

    def add_message(self, channel: str, message: dict) -> dict:
        """Put a message into a channel as Slack would have it (`ts` assigned if absent)."""
        with self._lock:
            message = {"type": "message", **message}
            message.setdefault("ts", self.next_ts())
            self.messages.setdefault(channel, []).append(message)
            self.messages[channel].sort(key=lambda m: float(m["ts"]))
            thread = message.get("thread_ts")
            if thread and thread != message["ts"]:
                for m in self.messages[channel]:
                    if m["ts"] == thread:
                        m["reply_count"] = m.get("reply_count", 0) + 1
                        m.setdefault("thread_ts", thread)
            return dict(message)

    def edit_message(self, channel: str, ts: str, text: str) -> tuple[dict, dict]:
        """Change a message's text as its author would: (previous, new)."""
        with self._lock:
            m = self._find(channel, ts)
            previous = dict(m)
            m["text"] = text
            m["edited"] = {"user": m.get("user"), "ts": self.next_ts()}
            return previous, dict(m)

    def delete_message(self, channel: str, ts: str) -> dict:
        with self._lock:
            m = self._find(channel, ts)
            self.messages[channel].remove(m)
            return m

    def tombstone_message(self, channel: str, ts: str) -> tuple[dict, dict]:
        """Delete a thread's parent as Slack does: a tombstone stays. (previous, tombstone)"""
        with self._lock:
            m = self._find(channel, ts)
            previous = dict(m)
            for k in ("user", "text", "files", "edited", "team", "client_msg_id"):
                m.pop(k, None)
            m.update(subtype="tombstone", user="USLACKBOT", text="This message was deleted.",
                     hidden=True)
            return previous, dict(m)

    def add_file(self, name: str, content: bytes, mimetype: str = "text/plain",
                 filetype: str = "text") -> dict:
        file_id = "F" + uuid.uuid4().hex[:10].upper()
        info = {"id": file_id, "name": name, "title": name, "mimetype": mimetype,
                "filetype": filetype, "size": len(content), "mode": "hosted",
                "url_private": f"http://127.0.0.1:{self.port}/files/{file_id}/{name}",
                "url_private_download":
                    f"http://127.0.0.1:{self.port}/files/{file_id}/{name}?download=1"}
        with self._lock:
            self.files[file_id] = (info, content)
        return dict(info)

    def dm_of(self, user: str) -> str:
        """The id of Steward's DM with a person (U0ALICE -> D0ALICE unless set)."""
        with self._lock:
            return self.dms.setdefault(user, "D" + user[1:])

    def join(self, channel: str, kind: str | None = None) -> None:
        """Steward is invited to a channel: `kind` is its type as users.conversations asks
        for it (public_channel, private_channel or mpim; by default from the id: C...
        public, G... private)."""
        with self._lock:
            self.joined[channel] = kind or ("private_channel" if channel.startswith("G")
                                            else "public_channel")

    def add_user(self, user: str, name: str, *, is_bot: bool = False,
                 tz: str | None = "UTC") -> None:
        """A person, with their profile's timezone as users.info gives it (`tz`, `tz_label`,
        `tz_offset`); `tz=None` leaves the fields out, and any other string is given as is
        (Slack's data is not to be trusted blindly)."""
        with self._lock:
            self.users[user] = {"id": user, "team_id": TEAM, "name": name.lower(),
                                "real_name": name, "is_bot": is_bot,
                                "profile": {"real_name": name, "display_name": name}}
            self.set_tz(user, tz)

    def set_tz(self, user: str, tz: str | None) -> None:
        """Change a person's timezone (they travelled, or changed their profile)."""
        with self._lock:
            info = self.users[user]
            for k in ("tz", "tz_label", "tz_offset"):
                info.pop(k, None)
            if tz is None:
                return
            info["tz"] = tz
            try:
                now = datetime.now(ZoneInfo(tz))
            except (ZoneInfoNotFoundError, ValueError):
                info.update(tz_label="", tz_offset=0)
                return
            offset = now.utcoffset()
            info.update(tz_label=now.tzname() or tz,
                        tz_offset=int(offset.total_seconds()) if offset else 0)

    # -- Web API methods (called with the lock held) ----------------------------------

    def _m_auth_test(self, p: dict) -> dict:
        return {"ok": True, "url": "https://fake.slack.com/", "team": "Fake", "user": "steward",
                "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID, "is_enterprise_install":
                False}

    def _m_apps_connections_open(self, p: dict) -> dict:
        return {"ok": True, "url": f"ws://127.0.0.1:{self.port}/socket?ticket={uuid.uuid4()}"}

    def _m_conversations_open(self, p: dict) -> dict:
        if p.get("channel"):
            return {"ok": True, "no_op": True, "already_open": True,
                    "channel": {"id": p["channel"]}}
        users = [u for u in str(p.get("users", "")).split(",") if u]
        if len(users) != 1:  # a group DM (mpim) is not needed by Steward
            return {"ok": False, "error": "not_implemented" if users else "users_list_not_supplied"}
        if users[0] not in self.users:
            return {"ok": False, "error": "user_not_found"}
        opened = users[0] in self.dms
        return {"ok": True, "no_op": opened, "already_open": opened,
                "channel": {"id": self.dm_of(users[0])}}

    def _m_users_conversations(self, p: dict) -> dict:
        types = [t for t in str(p.get("types") or "public_channel").split(",") if t]
        needed = sorted({_READ_SCOPES.get(t, "") for t in types} & self.missing_scopes)
        if needed:
            return {"ok": False, "error": "missing_scope", "needed": ",".join(needed),
                    "provided": "chat:write,im:history"}
        found = []
        if "im" in types:
            users = {dm: user for user, dm in self.dms.items()}
            for dm in sorted({*self.dms.values(), *(c for c in self.messages
                                                    if c.startswith("D"))}):
                found.append({"id": dm, "created": self._base, "is_im": True,
                              "is_org_shared": False, "user": users.get(dm, "U" + dm[1:]),
                              "is_user_deleted": False, "priority": 0})
        for channel, kind in sorted(self.joined.items()):
            if kind in types:
                found.append({"id": channel, "name": channel.lower(), "created": self._base,
                              "is_channel": kind == "public_channel",
                              "is_group": kind == "private_channel", "is_im": False,
                              "is_mpim": kind == "mpim", "is_private": kind != "public_channel",
                              "is_archived": False, "is_member": True})
        start = int(p.get("cursor") or 0)
        limit = min(int(p.get("limit") or 100), self.page_cap)
        more = start + limit < len(found)
        return {"ok": True, "channels": found[start:start + limit],
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}}

    def _m_chat_postMessage(self, p: dict) -> dict:  # noqa: N802 - Slack's method name
        channel = p.get("channel", "")
        if not channel:
            return {"ok": False, "error": "channel_not_found"}
        message = {"type": "message", "user": BOT_USER, "bot_id": BOT_ID, "app_id": "A0FAKE",
                   "text": p.get("text", ""), "ts": self.next_ts(), "team": TEAM}
        if p.get("thread_ts"):
            message["thread_ts"] = p["thread_ts"]
        metadata = _json_param(p.get("metadata"))
        if metadata:
            message["metadata"] = metadata
        blocks = _json_param(p.get("blocks"), list)
        if blocks:
            message["blocks"] = blocks
        stored = self.add_message(channel, message)
        return {"ok": True, "channel": channel, "ts": stored["ts"],
                "message": {k: v for k, v in stored.items() if k != "metadata"}}

    def _m_chat_update(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("ts", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        if m.get("bot_id") != BOT_ID:
            return {"ok": False, "error": "cant_update_message"}
        m["text"] = p.get("text", "")
        m["edits"] = m.get("edits", 0) + 1
        metadata = _json_param(p.get("metadata"))
        if metadata:
            m["metadata"] = metadata
        blocks = _json_param(p.get("blocks"), list)
        if blocks:
            m["blocks"] = blocks
        return {"ok": True, "channel": p["channel"], "ts": m["ts"], "text": m["text"]}

    def _m_chat_postEphemeral(self, p: dict) -> dict:  # noqa: N802 - Slack's method name
        if not p.get("channel") or not p.get("user"):
            return {"ok": False, "error": "channel_not_found" if not p.get("channel")
                    else "user_not_in_channel"}
        self.ephemeral.append({"channel": p["channel"], "user": p["user"],
                               "text": p.get("text", "")})
        return {"ok": True, "message_ts": self.next_ts()}

    def _m_chat_delete(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("ts", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        self.messages[p["channel"]].remove(m)
        return {"ok": True, "channel": p["channel"], "ts": m["ts"]}

    def _m_conversations_history(self, p: dict) -> dict:
        msgs = [m for m in self.messages.get(p.get("channel", ""), [])
                if m.get("thread_ts") in (None, m["ts"])]
        return self._page(list(reversed(msgs)), p)

    def _m_conversations_replies(self, p: dict) -> dict:
        root = p.get("ts", "")
        msgs = [m for m in self.messages.get(p.get("channel", ""), [])
                if m["ts"] == root or m.get("thread_ts") == root]
        if not msgs:
            return {"ok": False, "error": "thread_not_found"}
        return self._page(msgs, p)

    def _page(self, msgs: list[dict], p: dict) -> dict:
        inclusive = str(p.get("inclusive", "0")) in ("1", "true")
        oldest, latest = p.get("oldest"), p.get("latest")
        if oldest:
            msgs = [m for m in msgs if float(m["ts"]) > float(oldest)
                    or (inclusive and m["ts"] == oldest)]
        if latest:
            msgs = [m for m in msgs if float(m["ts"]) < float(latest)
                    or (inclusive and m["ts"] == latest)]
        start = int(p.get("cursor") or 0)
        limit = min(int(p.get("limit") or 100), self.page_cap)
        page = msgs[start:start + limit]
        with_meta = str(p.get("include_all_metadata", "0")) in ("1", "true")
        out = [m if with_meta else {k: v for k, v in m.items() if k != "metadata"}
               for m in (dict(m) for m in page)]
        more = start + limit < len(msgs)
        return {"ok": True, "messages": out, "has_more": more,
                "response_metadata": {"next_cursor": str(start + limit) if more else ""}}

    def _m_reactions_add(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("timestamp", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        names = m.setdefault("reactions_by_bot", [])
        if p["name"] in names:
            return {"ok": False, "error": "already_reacted"}
        names.append(p["name"])
        return {"ok": True}

    def _m_reactions_remove(self, p: dict) -> dict:
        m = self._find(p.get("channel", ""), p.get("timestamp", ""), missing_ok=True)
        if m is None:
            return {"ok": False, "error": "message_not_found"}
        names = m.get("reactions_by_bot", [])
        if p["name"] not in names:
            return {"ok": False, "error": "no_reaction"}
        names.remove(p["name"])
        return {"ok": True}

    def _m_users_info(self, p: dict) -> dict:
        user = self.users.get(p.get("user", ""))
        return {"ok": True, "user": dict(user)} if user else {"ok": False,
                                                             "error": "user_not_found"}

    def _find(self, channel: str, ts: str, missing_ok: bool = False) -> dict | None:
        for m in self.messages.get(channel, []):
            if m["ts"] == ts:
                return m
        if missing_ok:
            return None
        raise KeyError(f"no message {ts} in {channel}")


_READ_SCOPES = {"im": "im:read", "mpim": "mpim:read", "public_channel": "channels:read",
                "private_channel": "groups:read"}


def is_user_id(value: str) -> bool:
    """A person's id (U..., or W... on Enterprise Grid), not a conversation's."""
    return value[:1] in ("U", "W") and value[1:].isalnum()


def _json_param(value: Any, shape: type = dict) -> Any:
    """A parameter the SDK sends as JSON text (or as JSON in a JSON body), if of `shape`."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, shape) else None
