"""The JSONL format of DESIGN.md, one message per line:

    {"session": KEY, "role": "user"|"assistant", "author": NAME, "text": STR,
     "ts": ISO-8601, "ref": EXTERNAL_ID}

`ref` is optional (a stable one is derived from session, time and text). Extensions, all
optional: `ts` may also be unix seconds; `owner` and `scope` set who the conversation
belongs to when the import creates it (default: the store's, private to the local user,
as for terminal sessions). Blank lines are ignored; every other bad line is a `Problem`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

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


def to_item(obj) -> Item:
    if not isinstance(obj, dict):
        raise Invalid("not a JSON object")
    session = obj.get("session")
    if not isinstance(session, str) or not session.strip():
        raise Invalid("missing session")
    if len(session) > MAX_KEY:
        raise Invalid(f"session longer than {MAX_KEY} characters")
    role = obj.get("role")
    if role not in ROLES:
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
    session = clean(session)
    text = clean(text)
    if ref is None:
        ref = f"jsonl:{digest(session, repr(ts), text)}"
    ref = bounded_id(ref)
    return Item(key=session, kind=role, text=text, author=fit(author, MAX_AUTHOR), ref=ref,
                # a ref is an id in its source; scoped by session so two sources' ids
                # (Slack ts in two channels, say) never collide
                external_id=bounded_id(f"{session}|{ref}"), created_at=ts,
                owner=fit(owner, MAX_AUTHOR), scope=fit(scope, MAX_SCOPE),
                data={"import": "jsonl"})


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
                    yield to_item(json.loads(raw))
                except Invalid as exc:
                    yield Problem(where, str(exc))
                except (ValueError, RecursionError) as exc:  # bad JSON or bad UTF-8
                    yield Problem(where, f"not JSON: {str(exc)[:200]}")
                except Exception as exc:  # an odd value stops only this line
                    yield Problem(where, f"{type(exc).__name__}: {str(exc)[:200]}")
