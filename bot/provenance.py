"""Where words came from: the one rule of authority across turns.

The model does what text tells it often enough, so what a turn may do unasked depends on
whose words are in its request. Words are either the person's own (what they wrote in
their messages) or OUTSIDE text: a web page, a search hit, an MCP server's answer, a
forwarded, quoted or attached part of a message, and everything the model made while
such text was in front of it. Outside text is data, never permission.

The mark belongs to the data, not to the turn that read it: everything Steward stores
that can reach the model again carries it, under `MARK` (its value says why, e.g. "a
forwarded message"):

    transcript entries    `data[MARK]` (tool results of READS_OUTSIDE tools, the answers
                          and tool calls of a turn that had outside text, a reminder's
                          message when the reminder was made from outside text); a
                          person's message is outside text in part when it forwards,
                          quotes or attaches (`outside_in`)
    summaries             the compaction entry's `data[MARK]`, when what it summarised was
    facts, to-do items    the item's `MARK`, when a turn with outside text wrote it
    schedules             `origin`, when a turn with outside text made or changed it

A turn's request is outside text when any of that is in it (the window, the summary, the
facts block, recalled memories: `Marked` text carries the mark through reading), and then
(bot/tools/permissions.py) sending, scheduling, changing what Steward remembers, and
calls to MCP tools the owner has not declared trusted wait for the person's yes, and
whatever the turn writes is marked in turn. A fetch is unasked only for an address that
stands whole in the person's own words (`own_words`), never one from an outside part.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MARK = "outside"

# Horizontal space only ([ \t]), never \s: a pattern that can span lines backtracks over
# every blank line of a long message (this runs for each message of every window).
FORWARDED = re.compile(r"^[ \t]*(-{5,}[ \t]*Forwarded message[ \t]*-{5,}|Begin forwarded "
                       r"message:|-{2,}[ \t]*Original Message[ \t]*-{2,})[ \t]*$",
                       re.IGNORECASE | re.MULTILINE)
QUOTED = re.compile(r"^[ \t]*>", re.MULTILINE)
# Where a connector puts a file's text into a message (bot/attachments, the email render):
# from there on, the message is the file's words.
ATTACHED = re.compile(r"^\[(document|Attachment|attached file): ", re.MULTILINE)
URL = re.compile(r"https?://[^\s<>\"'`|\\^{}]+", re.IGNORECASE)
_TRAILING = ".,;:!?)]}'\"*_~"


class Marked(str):
    """Text that keeps where its words came from: `outside` says why they are not the
    person's own (None: they are). Reads as the plain string everywhere else."""

    outside: str | None

    def __new__(cls, text: str, outside: str | None = None) -> Marked:
        value = super().__new__(cls, text)
        value.outside = outside
        return value


def marked(why: str | None) -> dict[str, str]:
    """The mark to store with something made from outside text (`why`), or nothing."""
    return {MARK: why} if why else {}


def outside_of(value: Any) -> str | None:
    """The mark of a `Marked` text (or of anything with one); None for plain text."""
    return getattr(value, "outside", None)


def _may_forward(text: str) -> bool:
    """Whether `text` could hold a forward marker (plain substring tests: a case-blind
    regex search costs ~10 us on a 500-character message)."""
    return any(hint in text for hint in ("orward", "ORWARD", "riginal", "RIGINAL"))


def outside_in(text: str, data: dict | None) -> str | None:
    """What in a person's message is someone else's text (None: all their own). The
    substring checks first: most messages have none of the markers, and they cost less."""
    if _may_forward(text) and FORWARDED.search(text):
        return "a forwarded message"
    if ">" in text and QUOTED.search(text):
        return "quoted text"
    if (data or {}).get("attachments") or ("[" in text and ATTACHED.search(text)):
        return "an attached file"  # bot.attachments.REF, or a file's text in the message
    return None


def of_entry(entry: Any) -> str | None:
    """Why a transcript entry's words are (in part) not the person's own, or None."""
    data = entry.data if isinstance(entry.data, dict) else {}
    if data.get(MARK):
        return str(data[MARK])
    if entry.kind == "tool_result" and data.get("untrusted"):  # marked before MARK existed
        return f"a result of {data.get('name') or 'a tool'}"
    if entry.kind == "user":
        return outside_in(entry.text, data)
    return None


def first(reasons: Iterable[str | None]) -> str | None:
    return next((r for r in reasons if r), None)


def own_part(text: str) -> str:
    """The person's own words in a message: what comes before a forwarded message or an
    attached file's text, without quoted lines."""
    cut = min((m.start() for m in (FORWARDED.search(text), ATTACHED.search(text)) if m),
              default=len(text))
    return "\n".join(line for line in text[:cut].splitlines()
                     if not line.lstrip().startswith(">"))


def own_words(entries: Iterable[Any]) -> str:
    """What the person wrote in these messages (their own parts, `own_part`): a message
    marked as a whole (a reminder from outside text) adds nothing."""
    return "\n".join(own_part(e.text) for e in entries if e.kind == "user"
                     and not (e.data if isinstance(e.data, dict) else {}).get(MARK))


def whole_urls(text: str) -> set[str]:
    """The addresses that stand whole in `text`, without the punctuation after them."""
    return {m.group(0).rstrip(_TRAILING) for m in URL.finditer(text)}


def urls_in(value: Any) -> list[str]:
    """Every address anywhere in a tool call's arguments (nested values included)."""
    found: list[str] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            found += [m.group(0).rstrip(_TRAILING) for m in URL.finditer(v)]
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return found
