"""The JSONL format of DESIGN.md, one message per line:

    {"session": KEY, "role": "user"|"assistant", "author": NAME, "text": STR,
     "ts": ISO-8601, "ref": EXTERNAL_ID}

`ref` is optional (a stable one is derived from session, time and text). Extensions, all
optional: `ts` may also be unix seconds; `owner` and `scope` set who the conversation
belongs to when the import creates it (default: the store's, private to the local user,
as for terminal sessions). Blank lines are ignored; every other bad line is a `Problem`.

`steward export` writes the same lines with more in them (`export_line`), so that what it
wrote imports back as it was:

    {"session": KEY, "seq": N, "role": KIND, "author": NAME, "text": STR,
     "ts": ISO-8601 (to the microsecond), "ref": ID, "owner": ID, "scope": SCOPE,
     "task": TASK_ID, "data": {...}, "files": {SHA256: RELATIVE_PATH}}

A line with `seq` (the entry's position in its conversation) is an entry, not only a
message: `role` may be any entry kind (`KINDS`: tool results, compaction summaries, notes;
a `compaction` is the conversation's head marker again), the line is identified by
session and `seq` (so an export imported twice adds nothing) and a missing `ref` stays
missing. `data` (on any line) is the entry's data as it was, instead of {"import":
"jsonl"}: tool calls, provenance marks, attachments' refs. `task` is the id of the task
that wrote the entry (a turn's entries stay together). `files` names, relative to the
file's folder, the bytes of the blobs the data refers to: the import puts them in the
home's blob store (each checked against its SHA-256). Without `seq`, `role` is still only
`user` or `assistant`, as before.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from bot.importers.lines import MAX_LINE, Lines
from bot.importers.model import (
    MAX_AUTHOR,
    MAX_KEY,
    MAX_SCOPE,
    Item,
    Problem,
    Skip,
    bounded_id,
    clean,
    digest,
    fit,
)

ROLES = ("user", "assistant")
# Every kind of transcript entry (store: entries.kind), which an exported line may carry.
KINDS = ("user", "assistant", "tool_result", "system", "compaction", "aborted", "reset")
MAX_TASK_ID = 32  # store: entries.task_id
DIGEST = re.compile(r"[0-9a-f]{64}")  # a blob's name (bot/attachments/blobs.py)
POSITIONS = ("answers_upto", "cut_seq", "previous_cut")  # entry data the agent compares


class Invalid(ValueError):
    pass


def parse_ts(value) -> float:
    if isinstance(value, bool):
        raise Invalid("ts must be ISO-8601 or unix seconds")
    if isinstance(value, int | float):
        if abs(value) > 1e11 or not math.isfinite(value):
            raise Invalid("ts is not a plausible unix time")
        return float(value)
    if not isinstance(value, str) or not value.strip():
        raise Invalid("missing ts")
    try:
        when = datetime.fromisoformat(value.strip())
    except ValueError:
        raise Invalid(f"ts {value[:40]!r} is not ISO-8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # a time without a zone is read as UTC
    return when.timestamp()


def _optional_str(obj: dict, name: str) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Invalid(f"{name} must be a string")
    return value


def _seq(obj: dict) -> int | None:
    seq = obj.get("seq")
    if seq is None:
        return None
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise Invalid("seq must be a whole number from 1")
    return seq


def _tool_call(call) -> bool:
    """A stored tool call as the context reads it (bot.llm.types.ToolCall)."""
    return (isinstance(call, dict) and isinstance(call.get("id"), str)
            and isinstance(call.get("name"), str)
            and isinstance(call.get("arguments", {}), dict))


def _data(obj: dict) -> dict | None:
    """The line's `data`, checked so that nothing the agent reads in it can stop a
    conversation: an object (or null) that the store can write, with tool calls and
    positions of the shapes the agent reads."""
    data = obj["data"]
    if data is None:
        return None
    if not isinstance(data, dict):
        raise Invalid("data must be a JSON object")
    try:
        json.dumps(data, allow_nan=False)
    except ValueError:
        raise Invalid("data holds a number JSON cannot store (NaN or Infinity)") from None
    calls = data.get("tool_calls", [])
    if not isinstance(calls, list) or not all(_tool_call(c) for c in calls):
        raise Invalid("data.tool_calls must be a list of {id, name, arguments}")
    for name in POSITIONS:
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise Invalid(f"data.{name} must be a whole number")
    return data


def _files(obj: dict, base: Path | None) -> tuple[tuple[str, Path], ...]:
    """`files` as (sha256, path): each path relative to `base` and inside it."""
    files = obj.get("files")
    if files is None or base is None:
        return ()
    if not isinstance(files, dict):
        raise Invalid("files must be a JSON object of sha256: path")
    root = base.resolve()
    found = []
    for sha, name in files.items():
        if not DIGEST.fullmatch(sha):
            raise Invalid(f"files: {sha[:80]!r} is not a sha256")
        if not isinstance(name, str) or not name:
            raise Invalid("files: a path must be a non-empty string")
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts or "\\" in name:
            raise Invalid(f"files: {name[:80]!r} is not a path inside the file's folder")
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            raise Invalid(f"files: {name[:80]!r} leads out of the file's folder")
        found.append((sha, path))
    return tuple(found)


def to_item(obj, base: Path | None = None) -> Item:
    """The import record of one line; `base` is the file's folder (where `files` are)."""
    if not isinstance(obj, dict):
        raise Invalid("not a JSON object")
    session = obj.get("session")
    if not isinstance(session, str) or not session.strip():
        raise Invalid("missing session")
    if len(session) > MAX_KEY:
        raise Invalid(f"session longer than {MAX_KEY} characters")
    seq = _seq(obj)
    role = obj.get("role")
    if seq is not None and role not in KINDS:
        raise Invalid(f"role must be one of {', '.join(KINDS)}, not {role!r}"[:160])
    if seq is None and role not in ROLES:
        raise Invalid(f"role must be 'user' or 'assistant', not {role!r}"[:120])
    text = obj.get("text")
    if not isinstance(text, str):
        raise Invalid("missing text" if text is None else "text must be a string")
    ts = parse_ts(obj.get("ts"))
    ref = obj.get("ref")
    if isinstance(ref, int) and not isinstance(ref, bool):
        ref = str(ref)
    if ref is not None and (not isinstance(ref, str) or not ref):
        raise Invalid("ref must be a non-empty string")
    author = _optional_str(obj, "author")
    owner = _optional_str(obj, "owner")
    scope = _optional_str(obj, "scope")
    task = _optional_str(obj, "task")
    if task is not None and not 0 < len(task) <= MAX_TASK_ID:
        raise Invalid(f"task must be an id of 1 to {MAX_TASK_ID} characters")
    data = _data(obj) if "data" in obj else {"import": "jsonl"}
    files = _files(obj, base)
    session = clean(session)
    text = clean(text)
    if ref is None and seq is None:
        ref = f"jsonl:{digest(session, repr(ts), text)}"
    ref = None if ref is None else bounded_id(ref)
    # A ref is an id in its source; scoped by session so two sources' ids (Slack ts in two
    # channels, say) never collide. An exported entry is the one at its position.
    external_id = f"{session}|#{seq}" if seq is not None else f"{session}|{ref}"
    return Item(key=session, kind=role, text=text, author=fit(author, MAX_AUTHOR), ref=ref,
                external_id=bounded_id(external_id), created_at=ts,
                owner=fit(owner, MAX_AUTHOR), scope=fit(scope, MAX_SCOPE), data=data,
                seq=seq, task_id=task, files=files)


def iso(t: float) -> str:
    """A time as export writes it: ISO-8601 in UTC, to the microsecond (`parse_ts` reads
    it back to the same microsecond)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds")


def export_line(*, session: str, owner: str | None, scope: str, entry: Any,
                files: dict[str, str] | None = None) -> bytes:
    """One entry (a `store.Entry`) as the line that imports back as it is, UTF-8 with its
    newline. Keys with nothing to say (no author, ref, owner, task, files) are left out;
    `data` is always there (null too: the import then stores none)."""
    line: dict[str, Any] = {"session": session, "seq": entry.seq, "role": entry.kind}
    if entry.author is not None:
        line["author"] = entry.author
    line["text"] = entry.text
    line["ts"] = iso(entry.created_at)
    if entry.ref is not None:
        line["ref"] = entry.ref
    if owner is not None:
        line["owner"] = owner
    line["scope"] = scope
    if entry.task_id:
        line["task"] = entry.task_id
    line["data"] = entry.data
    if files:
        line["files"] = files
    try:
        return (json.dumps(line, ensure_ascii=False) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate in the data: JSON's escapes carry it
        return (json.dumps(line) + "\n").encode("ascii")


class JsonlReader:
    format = "jsonl"

    def __init__(self, path: Path, *, max_line: int = MAX_LINE):
        self.path = path
        self.total = path.stat().st_size
        self.position = 0
        self._max_line = max_line

    def read(self) -> Iterator[Item | Skip | Problem]:
        with open(self.path, "rb") as f:
            lines = Lines(f, self._max_line)
            for number, raw, _start in lines:
                self.position = lines.position
                where = f"line {number}"
                if raw is None:
                    yield Problem(where, f"line longer than {self._max_line} bytes")
                    continue
                if not raw.strip():
                    continue
                try:
                    yield to_item(json.loads(raw), self.path.parent)
                except Invalid as exc:
                    yield Problem(where, str(exc))
                except (ValueError, RecursionError) as exc:  # bad JSON or bad UTF-8
                    yield Problem(where, f"not JSON: {str(exc)[:200]}")
                except Exception as exc:  # an odd value stops only this line
                    yield Problem(where, f"{type(exc).__name__}: {str(exc)[:200]}")
