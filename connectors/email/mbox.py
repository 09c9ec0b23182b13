"""An mbox file, split into messages while it is read (one message in memory at a time;
the stdlib `mailbox` module would index the whole file first).

A message starts at a `From ` line at the start of the file or after a blank line (or one
that looks like a real From_ line, with a time and a year); `>From ` escapes lose one `>`.
Each message is read exactly as the email connector reads live mail (its tolerant parser,
charset guessing, HTML to text, quoted history trimmed, the same entry text and data), so
imported and live mail look alike; attachment bytes are not stored, only their notes.

Threads are the connector's too: `email:<root>`, the root being the first id in
References, else In-Reply-To, else the message's own Message-ID (no ids at all: the
sender and normalised subject). A thread belongs to the person who started it; a message
in it from someone else goes to `email:<root>/from:<sender>`, so nobody's mail reaches
another person's memory. Mail from the mailbox owner (`[email] address`) is Steward's side
(kind assistant) and belongs with its first recipient. Scope: `private:<that address>`.
Ids are the connector's (`msgid:<id>`, else `sha256:<digest of the raw message>`), and a
message the live connector already took in is not imported again.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from datetime import UTC
from email.utils import parsedate_to_datetime
from pathlib import Path

from bot.importers.model import MAX_AUTHOR, Item, Problem, clean, clean_value, fit
from connectors.email import headers
from connectors.email.parse import Unparsable, parse_mail
from connectors.email.render import render
from connectors.email.threads import CHANNEL as LIVE_CHANNEL
from connectors.email.threads import chain, normalised_subject

MAX_MESSAGE = 128 * 1024 * 1024
MAX_PIECE = 1024 * 1024  # longer lines are read in pieces
TEXT_ATTACHMENT_BYTES = 1_000_000  # text attachments up to this size are read into the text
_FROM_LINE = re.compile(rb"^From \S+.*\d{1,2}:\d{2}(:\d{2})?.*\d{4}")
_ESCAPED_FROM = re.compile(rb"^>+From ")


def _when(date: str, from_line: bytes) -> float | None:
    tail = from_line.decode("latin-1")[5:].split(None, 1)
    for raw in (date, tail[-1] if tail else ""):
        if not raw or not raw.strip():
            continue
        try:
            when = parsedate_to_datetime(raw.strip())
        except (TypeError, ValueError, IndexError, OverflowError):
            continue
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    return None


class MboxReader:
    format = "mbox"

    def __init__(self, path: Path, *, owner_address: str = ""):
        self.path = path
        self.total = path.stat().st_size
        self.position = 0
        self.owner = owner_address.strip().lower()

    def read(self) -> Iterator[Item | Problem]:
        with open(self.path, "rb") as f:
            lines: list[bytes] | None = None  # the current message's lines
            from_line = b""
            size = start = count = 0
            too_large = False
            previous_blank = at_line_start = True
            leading = False  # non-blank data before the first From_ line
            while True:
                offset = self.position
                line = f.readline(MAX_PIECE)
                if not line:
                    break
                self.position += len(line)
                line_start, at_line_start = at_line_start, line.endswith(b"\n")
                if (line_start and line.startswith(b"From ")
                        and (previous_blank or _FROM_LINE.match(line))):
                    if lines is not None:
                        yield self._finish(lines, from_line, count, start, too_large)
                    elif leading:
                        yield Problem("byte 0", "data before the first 'From ' line skipped")
                    count += 1
                    lines, from_line, size, start, too_large = [], line, 0, offset, False
                    previous_blank = False
                    continue
                previous_blank = line_start and not line.strip()
                if lines is None:
                    leading = leading or bool(line.strip())
                    continue
                if too_large:
                    continue
                size += len(line)
                if size > MAX_MESSAGE:
                    too_large, lines = True, []
                    continue
                if line_start and _ESCAPED_FROM.match(line):
                    line = line[1:]
                lines.append(line)
            if lines is not None:
                yield self._finish(lines, from_line, count, start, too_large)
            elif leading:
                yield Problem("byte 0", "no 'From ' line: not an mbox file")

    def _finish(self, lines: list[bytes], from_line: bytes, number: int, start: int,
                too_large: bool) -> Item | Problem:
        where = f"message {number} at byte {start}"
        if too_large:
            return Problem(where, f"larger than {MAX_MESSAGE} bytes")
        raw = b"".join(lines)
        lines.clear()
        try:
            return self._item(raw, from_line)
        except Unparsable as exc:
            return Problem(where, str(exc)[:200])
        except Exception as exc:  # malformed MIME of any kind stops only this message
            return Problem(where, f"{type(exc).__name__}: {str(exc)[:200]}")

    def _item(self, raw: bytes, from_line: bytes) -> Item:
        mail = parse_mail(raw, max_attachment_bytes=TEXT_ATTACHMENT_BYTES)
        rendered = render(mail, doc_prefix="import", max_attachment_bytes=TEXT_ATTACHMENT_BYTES)
        data = rendered.data
        for note in data["email"]["attachments"]:  # attachment bytes are not imported
            if note["document"] is not None:
                note["document"], note["omitted"] = None, "not stored by the import"
        data["import"] = "mbox"

        ids = chain(mail)
        if ids:
            root = ids[0]
        elif mail.message_id:
            root = mail.message_id
        else:
            root = "no-id:" + hashlib.sha256(
                f"{mail.sender}\n{normalised_subject(mail.subject)}".encode(
                    "utf-8", "replace")).hexdigest()[:24]
        mine = bool(self.owner) and mail.sender == self.owner
        if mine:
            recipient = headers.address(mail.msg, "To")[1]
            party = recipient if recipient and recipient != self.owner else self.owner
        else:
            party = mail.sender
        ref = (f"msgid:{mail.message_id}" if mail.message_id
               else f"sha256:{hashlib.sha256(raw).hexdigest()}")
        return Item(
            key=f"{LIVE_CHANNEL}:{root}", kind="assistant" if mine else "user",
            text=clean(rendered.text), author=fit(mail.sender, MAX_AUTHOR), ref=ref,
            external_id=ref, created_at=_when(mail.date, from_line),
            owner=fit(party, MAX_AUTHOR), scope=fit(f"private:{party}", MAX_AUTHOR),
            data=clean_value(data), live_ids=((LIVE_CHANNEL, ref),),
            foreign_key=f"{LIVE_CHANNEL}:" + headers.clip(f"{root}/from:{party}"))
