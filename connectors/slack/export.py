"""A Slack workspace export: a zip (or its unpacked folder) holding `users.json`,
`channels.json` (and `groups.json`, `mpims.json`, `dms.json` when present) and one folder
per conversation of `YYYY-MM-DD.json` message arrays. One member is parsed at a time.

Conversation keys are the Slack connector's (connectors/slack/routing.py), so imported
history joins live conversations:

    a DM's top level                slack:<team>:<channel>
    a thread reply (any kind)       slack:<team>:<channel>:<thread_ts>
    a channel thread's parent       slack:<team>:<channel>:<ts>  (its thread's conversation)
    a channel message, no thread    slack:<team>:<channel>

Authors are display names, as the connector shows them; a message the connector took in
already (same `<channel>:<ts>`) is not imported again. Scopes: a DM between a person and a
bot is private to that person (`private:slack:<team>:<user>`, the connector's owner id);
channels, private channels, group DMs and DMs between two people are `channel:<id>`
(seen only there).

Each JSON file is parsed whole, so each is bounded before it is parsed (a zip of under a
megabyte can hold gigabytes of `users.json`): at most `MAX_MEMBER` bytes decompressed
(read no further, whatever the zip's header says), and at most `MAX_PARSED` bytes once
parsed, estimated from its size and its count of values (commas and brackets: ten million
`[]` are 30 MB of text but a gigabyte of lists). A file past either, or nested too deeply
to parse, is a Problem and the rest of the export is still read.
"""

from __future__ import annotations

import html
import json
import os
import re
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from bot.importers.model import MAX_AUTHOR, Item, Problem, Skip, bounded_id, clean, fit

from . import routing

# Notices, not speech (joins, leaves, renames, pins...). Other subtypes are imported.
NOTICE_SUBTYPES = frozenset({
    "channel_join", "channel_leave", "group_join", "group_leave", "channel_topic",
    "channel_purpose", "channel_name", "channel_archive", "channel_unarchive", "group_topic",
    "group_purpose", "group_name", "group_archive", "group_unarchive", "pinned_item",
    "unpinned_item", "channel_convert_to_private", "channel_convert_to_public",
    "sh_room_created", "huddle_thread", "tombstone", "joiner_notification",
})
DIRECTORY_FILES = frozenset({"users.json", "channels.json", "groups.json", "mpims.json",
                             "dms.json"})
MESSAGE_FILE = re.compile(r"^([^/]+)/(\d{4}-\d{2}-\d{2})\.json$")
# Where the Slack connector records the messages it took in, each under "<channel>:<ts>".
LIVE_CHANNELS = (routing.CHANNEL, routing.HISTORY_CHANNEL)
MAX_MEMBER = 64 * 1024 * 1024  # decompressed bytes of one JSON file
MAX_PARSED = 512 * 1024 * 1024  # what one file may become parsed (estimated before)
VALUE_BYTES = 80  # one parsed JSON value, at most about (an empty list and its slot: 72)
# What reading one damaged member of a zip can raise.
DAMAGED = (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError)
_USER_MENTION = re.compile(r"<@([UW][A-Z0-9]+)(?:\|([^>]*))?>")
_CHANNEL_MENTION = re.compile(r"<#([CG][A-Z0-9]+)(?:\|([^>]*))?>")
_SLACK_ID = re.compile(r"^[CDG][A-Z0-9]{6,}$")


class Refused(Exception):
    """A JSON file of the export not parsed: it would cost too much (`str()` says why)."""


class Export:
    """A zip file or a folder, read member by member."""

    def __init__(self, path: Path):
        self.path = path
        self._zip = None if path.is_dir() else zipfile.ZipFile(path)
        self._prefix = ""  # an export zipped inside one top folder

    def names(self) -> list[str]:
        if self._zip is not None:
            found = [i.filename for i in self._zip.infolist() if not i.is_dir()]
        else:
            found = []
            for root, dirs, files in os.walk(self.path):
                dirs.sort()
                found.extend(Path(root, n).relative_to(self.path).as_posix() for n in files)
        if not any(n in DIRECTORY_FILES for n in found):
            tops = {n.split("/", 1)[0] for n in found if n.count("/") == 1
                    and n.split("/", 1)[1] in DIRECTORY_FILES}
            if len(tops) == 1:
                self._prefix = tops.pop() + "/"
                found = [n[len(self._prefix):] for n in found if n.startswith(self._prefix)]
        return found

    def size(self, name: str) -> int:
        if self._zip is not None:
            return self._zip.getinfo(self._prefix + name).file_size
        return (self.path / self._prefix / name).stat().st_size

    def open(self, name: str) -> BinaryIO:
        if self._zip is not None:
            return self._zip.open(self._prefix + name)
        return open(self.path / self._prefix / name, "rb")

    def load(self, name: str):
        """The parsed JSON file `name`, or Refused (bounded as the module says)."""
        if self.size(name) > MAX_MEMBER:
            raise Refused(f"larger than {MAX_MEMBER} bytes decompressed; not read")
        with self.open(name) as f:
            data = f.read(MAX_MEMBER + 1)
        if len(data) > MAX_MEMBER:
            raise Refused(f"larger than {MAX_MEMBER} bytes decompressed; not read")
        values = data.count(b",") + data.count(b"[") + data.count(b"{")
        if 3 * len(data) + VALUE_BYTES * values > MAX_PARSED:
            raise Refused(f"too many values to parse ({values} commas and brackets, more "
                          f"than {MAX_PARSED >> 20} MB parsed); not read")
        try:
            return json.loads(data)
        except RecursionError:
            raise Refused("nested too deeply to parse; not read") from None
        except MemoryError:
            raise Refused("needs more memory to parse than there is; not read") from None

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()


@dataclass
class Place:
    """Where a folder's messages go."""

    id: str
    kind: str  # "channel", "group", "mpim", "dm"
    members: list[str] = field(default_factory=list)


def user_name(user: dict) -> str | None:
    """The name the Slack connector shows for a person (display name first)."""
    profile = user.get("profile") or {}
    for name in (profile.get("display_name"), user.get("real_name"), profile.get("real_name"),
                 user.get("name")):
        if isinstance(name, str) and name.strip():
            return name.strip()
    return None


class SlackExportReader:
    format = "slack"

    def __init__(self, path: Path):
        self.path = path
        self.total: int | None = None  # uncompressed bytes of the message files
        self.position = 0
        self.team: str | None = None
        self.names: dict[str, str] = {}  # user id -> name
        self.bots: set[str] = {"USLACKBOT"}
        self.places: dict[str, Place] = {}  # folder -> place
        self.channel_names: dict[str, str] = {}
        self._setup_problems: list[Problem] = []

    # -- the workspace's directory -------------------------------------------------------

    def _load_list(self, export: Export, present: set[str], name: str) -> Iterator:
        if name not in present:
            return iter(())
        try:
            value = export.load(name)
        except Refused as exc:
            self._setup_problems.append(Problem(name, str(exc)))
            return iter(())
        except ValueError as exc:
            self._setup_problems.append(Problem(name, f"not JSON: {str(exc)[:200]}"))
            return iter(())
        except DAMAGED as exc:
            self._setup_problems.append(Problem(name, f"unreadable: {str(exc)[:200]}"))
            return iter(())
        if not isinstance(value, list):
            self._setup_problems.append(Problem(name, "not a JSON array"))
            return iter(())
        return (v for v in value if isinstance(v, dict) and isinstance(v.get("id"), str))

    def _directory(self, export: Export, present: set[str]) -> None:
        for user in self._load_list(export, present, "users.json"):
            name = user_name(user)
            if name:
                self.names[user["id"]] = name
            if user.get("is_bot") or user.get("is_app_user"):
                self.bots.add(user["id"])
            if self.team is None and isinstance(user.get("team_id"), str):
                self.team = user["team_id"]
        for file, kind in (("channels.json", "channel"), ("groups.json", "group"),
                           ("mpims.json", "mpim"), ("dms.json", "dm")):
            for c in self._load_list(export, present, file):
                folder = c["id"] if kind == "dm" else c.get("name") or c["id"]
                members = [m for m in c.get("members") or [] if isinstance(m, str)]
                self.places[folder] = Place(c["id"], kind, members)
                if isinstance(c.get("name"), str):
                    self.channel_names[c["id"]] = c["name"]

    def _place(self, folder: str) -> tuple[Place, Problem | None]:
        place = self.places.get(folder)
        if place is not None:
            return place, None
        if _SLACK_ID.match(folder):
            kind = "dm" if folder.startswith("D") else "channel"
            place = Place(folder, kind)
            note = None
        else:  # a folder no list names: keep its messages under the folder's name
            place = Place(folder, "channel")
            note = Problem(folder, "folder not listed in channels/groups/mpims/dms.json; "
                                   "imported with the folder name as the channel id")
        self.places[folder] = place
        return place, note

    # -- messages ------------------------------------------------------------------------

    def read(self) -> Iterator[Item | Skip | Problem]:
        export = Export(self.path)
        try:
            names = export.names()
            present = set(names)
            self._directory(export, present)
            yield from self._setup_problems
            files = sorted(n for n in names if MESSAGE_FILE.match(n))
            if not files:
                yield Problem(str(self.path), "no <channel>/<YYYY-MM-DD>.json files: "
                                              "not a Slack export?")
            self.total = sum(export.size(n) for n in files)
            for name in files:
                yield from self._member(export, name)
        finally:
            export.close()

    def _member(self, export: Export, name: str) -> Iterator[Item | Skip | Problem]:
        size = export.size(name)
        folder = MESSAGE_FILE.match(name).group(1)
        try:
            try:
                messages = export.load(name)
            except Refused as exc:
                yield Problem(name, str(exc))
                return
            except ValueError as exc:
                yield Problem(name, f"not JSON: {str(exc)[:200]}")
                return
            except DAMAGED as exc:  # a damaged member: the others still count
                yield Problem(name, f"unreadable: {str(exc)[:200]}")
                return
            if not isinstance(messages, list):
                yield Problem(name, "not a JSON array of messages")
                return
            place, note = self._place(folder)
            if note is not None:
                yield note
            for i, message in enumerate(messages):
                try:
                    yield self._message(place, message)
                except ValueError as exc:
                    yield Problem(f"{name} message {i}", str(exc)[:200])
                except Exception as exc:  # an odd shape stops only this message
                    yield Problem(f"{name} message {i}",
                                  f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            self.position += size

    def _text(self, message: dict) -> str:
        text = message.get("text") or ""
        if not isinstance(text, str):
            raise ValueError("text is not a string")
        if not text.strip():
            parts = [a.get("fallback") or a.get("text") or a.get("pretext") or ""
                     for a in message.get("attachments") or [] if isinstance(a, dict)]
            text = "\n".join(p for p in parts if isinstance(p, str) and p)
        text = _USER_MENTION.sub(
            lambda m: "@" + (self.names.get(m.group(1)) or m.group(2) or m.group(1)), text)
        text = _CHANNEL_MENTION.sub(
            lambda m: "#" + (m.group(2) or self.channel_names.get(m.group(1)) or m.group(1)),
            text)
        text = html.unescape(text) if "&" in text else text
        files = [f.get("title") or f.get("name") for f in message.get("files") or []
                 if isinstance(f, dict)]
        notes = "\n".join(f"[file: {f}]" for f in files if isinstance(f, str) and f)
        return clean("\n".join(p for p in (text, notes) if p))

    def _message(self, place: Place, message) -> Item | Skip:
        if not isinstance(message, dict):
            raise ValueError("not a JSON object")
        if message.get("type", "message") != "message":
            return Skip(str(message.get("type"))[:40])
        subtype = message.get("subtype")
        if subtype in NOTICE_SUBTYPES:
            return Skip(subtype)
        ts = message.get("ts")
        if not isinstance(ts, str):
            raise ValueError("missing ts")
        try:
            when = float(ts)
        except ValueError:
            raise ValueError(f"ts {ts[:40]!r} is not a Slack timestamp") from None
        text = self._text(message)
        if not text.strip():
            return Skip("empty")
        team = self.team = self.team or message.get("team") or message.get("user_team") or "T0"
        user = message.get("user") if isinstance(message.get("user"), str) else None
        bot_id = message.get("bot_id")
        is_bot = bool(bot_id) or subtype == "bot_message"
        author = self.names.get(user) if user else None
        if is_bot:
            author = (message.get("username") or (message.get("bot_profile") or {}).get("name")
                      or author or bot_id)
        author = author if isinstance(author, str) else user

        thread_ts = message.get("thread_ts")
        is_reply = isinstance(thread_ts, str) and thread_ts != ts
        if is_reply:
            key = routing.key_of(team, place.id, thread_ts)
        elif place.kind != "dm" and (thread_ts == ts or message.get("reply_count")):
            key = routing.key_of(team, place.id, ts)  # a parent opens its thread's conversation
        else:
            key = routing.key_of(team, place.id, None)

        people = [m for m in place.members if m not in self.bots]
        if place.kind == "dm" and len(people) == 1 and len(place.members) == 2:
            owner = routing.owner_of(team, people[0])
            scope = routing.private_scope(owner)
        else:
            owner = routing.owner_of(team, user) if user else None
            scope = routing.shared_scope(place.id)
        ref = bounded_id(f"{place.id}:{ts}")  # the connector's message id: <channel>:<ts>
        data = {"slack": {"channel": place.id, "ts": ts, "user": user,
                          "thread_ts": thread_ts if is_reply else None},
                "import": "slack"}
        return Item(key=bounded_id(key), kind="assistant" if is_bot else "user", text=text,
                    author=fit(author, MAX_AUTHOR), ref=ref, external_id=ref,
                    created_at=when, owner=fit(owner, MAX_AUTHOR), scope=scope, data=data,
                    live_ids=tuple((channel, ref) for channel in LIVE_CHANNELS))
