"""The readable half of `steward export`: one Markdown file per conversation, written as
its entries are read (a header, then each entry with its time and who said it), and the
index of them all. Made to be read, not imported back: `conversations.jsonl` is that.

Each message's text is written as it was (people write Markdown-ish text already); what
is not a person's or Steward's words (a tool's result) is fenced, a summary is quoted."""

from __future__ import annotations

import json
import re
from datetime import datetime
from zoneinfo import ZoneInfo

from bot.provenance import MARK

LABELS = {"user": "", "assistant": "Steward", "tool_result": "tool result",
          "compaction": "summary of the conversation so far", "system": "note",
          "aborted": "reply cut off", "reset": "reset"}
_BACKTICKS = re.compile(r"`+")


def when(t: float, zone: ZoneInfo) -> str:
    return datetime.fromtimestamp(t, zone).strftime("%Y-%m-%d %H:%M:%S %Z")


def inline(text: str) -> str:
    """`text` as inline code, whatever backticks it holds."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def fenced(text: str) -> str:
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}\n"


def quoted(text: str) -> str:
    return "".join(f"> {line}\n" if line else ">\n" for line in text.split("\n"))


def header(conv, *, parent_key: str | None, zone: ZoneInfo) -> str:
    lines = [f"# {inline(conv.key)}", "",
             f"- **owner:** {conv.owner or 'the local user'}",
             f"- **scope:** {inline(conv.scope)} (who may see what was said here)",
             f"- **entries:** {conv.last_seq}"]
    if parent_key is not None:
        lines.append(f"- **forked from:** {inline(parent_key)} at entry {conv.fork_at} "
                     "(its entries up to there are included)")
    if conv.head_seq:
        lines.append(f"- **context starts at:** entry {conv.head_seq} (the latest summary)")
    lines.append(f"- **times:** {zone.key}")
    return "\n".join(lines) + "\n\n---\n\n"


def entry(e, *, zone: ZoneInfo, files: list[tuple[str, str | None]]) -> str:
    """One entry; `files` are its attachments as (name, link or None when missing)."""
    data = e.data if isinstance(e.data, dict) else {}
    label = LABELS.get(e.kind, e.kind)
    if e.kind == "user":
        label = e.author or "user"
    elif e.kind == "assistant" and e.author:
        label = e.author
    elif e.kind == "tool_result" and data.get("name"):
        label = f"tool result of {inline(str(data['name']))}"
    top = f"### {label} · {when(e.created_at, zone)} · #{e.seq}\n\n"
    notes = []
    if data.get(MARK):
        notes.append(f"*from outside text ({data[MARK]}): data, not the person's words*")
    if e.kind == "tool_result" and data.get("is_error"):
        notes.append("*the call failed*")
    if e.kind == "compaction" and data.get("cut_seq"):
        notes.append(f"*summarises the entries up to #{data['cut_seq']}*")
    body = ""
    if e.kind == "tool_result":
        body = fenced(e.text)
    elif e.kind == "compaction":
        body = quoted(e.text)
    elif e.text:
        body = e.text.rstrip("\n") + "\n"
    calls = data.get("tool_calls") if isinstance(data.get("tool_calls"), list) else []
    for call in calls:
        if isinstance(call, dict):
            arguments = json.dumps(call.get("arguments", {}), ensure_ascii=False)
            body += f"\n→ calls {inline(str(call.get('name')))} with {inline(arguments)}\n"
    for name, link in files:
        body += (f"\n📎 [{name}]({link})\n" if link is not None
                 else f"\n📎 {name} (its file was missing from the home)\n")
    lead = "".join(f"{n}\n\n" for n in notes)
    return top + lead + body + "\n"


def index_header(made: str, what: str, version: str) -> str:
    return (f"# Steward export\n\nMade {made} by steward {version}: {what}.\n\n"
            "- `conversations.jsonl`: every entry, one JSON object per line, in the format "
            "`steward import` reads (`steward import conversations.jsonl` brings it into "
            "another home as it was)\n"
            "- `markdown/`: each conversation to read\n"
            "- `documents/`: each conversation's documents (its to-do list, files it "
            "was given), as JSON\n"
            "- `facts/`: what Steward remembers, per scope, as JSON\n"
            "- `attachments/`: the files people shared, by conversation\n"
            "- `export.json`: what this export holds and what it left out\n\n"
            "## Conversations\n\n")


def index_line(conv, link: str, entries: int) -> str:
    return (f"- [{inline(conv.key)}]({link}): {conv.owner or 'the local user'}, "
            f"{inline(conv.scope)}, {entries} entries\n")
