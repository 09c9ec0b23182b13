"""Raw message bytes -> `Mail`: who sent it, how it threads, its text and its attachments.

Tolerant by design: the stdlib parser (compat32) accepts nearly anything, and every step
after it falls back instead of failing (charsets: `charsets`; headers: `headers`; HTML:
inscriptis, then a crude tag strip). What cannot be made sense of at all (no header
section, no sender address, a parser crash) raises `Unparsable` with the reason; the
message is then quarantined.
"""

import email
import html
import mimetypes
import posixpath
import re
from dataclasses import dataclass, field
from email.message import Message

from inscriptis import get_text

from connectors.email import headers
from connectors.email.charsets import decode
from connectors.email.errors import Unparsable

MAX_PARTS = 200
MAX_DEPTH = 20
TEXTY_TYPES = {"application/json", "application/xml", "application/x-yaml", "application/yaml",
               "application/csv", "application/x-sh", "application/javascript",
               "application/x-python", "application/toml"}
TEXTY_EXTENSIONS = {".txt", ".md", ".csv", ".tsv", ".json", ".log", ".yaml", ".yml", ".xml",
                    ".ini", ".toml", ".py", ".sh", ".js", ".ts", ".sql", ".html", ".htm",
                    ".rst", ".org", ".tex"}


@dataclass
class Attachment:
    filename: str
    content_type: str
    size: int
    data: bytes | None  # None when larger than the cap
    text: str | None  # the readable text of a text attachment that was kept


@dataclass
class Mail:
    msg: Message  # for the header checks of the safety policy
    sender: str  # lower-cased address
    sender_name: str
    subject: str
    date: str
    message_id: str | None
    in_reply_to: list[str]
    references: list[str]
    body: str  # the full text; HTML converted
    body_format: str  # "plain", "html" or "none"
    attachments: list[Attachment] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    from_addresses: list[str] = field(default_factory=list)  # all of them (policy: one only)


def parse_mail(raw: bytes, *, max_attachment_bytes: int) -> Mail:
    if not raw.strip():
        raise Unparsable("empty message")
    try:
        msg = email.message_from_bytes(raw)
    except Exception as exc:  # the parser is lenient; a crash is a reason
        raise Unparsable(f"the MIME parser failed: {type(exc).__name__}: {exc}") from None
    if not msg.keys():
        raise Unparsable("no header section")
    name, sender = headers.address(msg, "From")
    if not sender:
        raise Unparsable("no usable From address")
    if len(sender) > 254:  # RFC 5321's limit; the store keeps authors in 256 characters
        raise Unparsable("From address longer than 254 characters")
    walker = _Walker(max_attachment_bytes)
    try:
        walker.walk(msg, 0)
    except RecursionError:
        raise Unparsable("MIME structure nested too deeply") from None
    ids = headers.message_ids(headers.raw(msg, "Message-ID"))
    defects = [type(d).__name__ for part in _parts(msg) for d in getattr(part, "defects", [])]
    return Mail(
        msg=msg, sender=sender, sender_name=name, subject=headers.header(msg, "Subject"),
        date=headers.header(msg, "Date"), message_id=ids[0] if ids else None,
        in_reply_to=headers.message_ids(headers.raw(msg, "In-Reply-To")),
        references=headers.message_ids(" ".join(headers.all_raw(msg, "References"))),
        body="\n\n".join(t for t in walker.texts if t.strip()).strip(),
        body_format=walker.body_format, attachments=walker.attachments,
        defects=sorted(set(defects)), from_addresses=headers.addresses(msg, "From"))


def _parts(msg: Message):
    count = 0
    for part in msg.walk():
        count += 1
        if count > MAX_PARTS:
            return
        yield part


class _Walker:
    """Collects the body text (text/plain preferred within an alternative) and the
    attachments, depth first."""

    def __init__(self, max_attachment_bytes: int):
        self.cap = max_attachment_bytes
        self.texts: list[str] = []
        self.attachments: list[Attachment] = []
        self.body_format = "none"
        self.parts = 0

    def walk(self, part: Message, depth: int) -> None:
        self.parts += 1
        if depth > MAX_DEPTH or self.parts > MAX_PARTS:
            return
        ctype = _content_type(part)
        payload = part.get_payload()
        if part.is_multipart() and isinstance(payload, list):
            if ctype == "multipart/alternative":
                self._alternative(payload, depth)
            else:
                for child in payload:
                    self.walk(child, depth + 1)
            return
        if ctype == "message/rfc822" and isinstance(payload, list) and payload:
            inner = payload[0]
            self.texts.append("---------- Forwarded message ----------\n" + "\n".join(
                f"{h}: {headers.header(inner, h)}" for h in ("From", "Date", "Subject")
                if headers.raw(inner, h)))
            self.walk(inner, depth + 1)
            return
        if self._is_attachment(part, ctype):
            self._attachment(part, ctype)
            return
        if ctype == "text/html":
            self.texts.append(html_to_text(_text_of(part)))
            self.body_format = "plain" if self.body_format == "plain" else "html"
        elif ctype.startswith("text/") or ctype.startswith("multipart/"):
            # text/plain, odd text types, and a multipart that lost its boundary
            self.texts.append(_text_of(part))
            self.body_format = "plain"
        else:
            self._attachment(part, ctype)

    def _alternative(self, children: list[Message], depth: int) -> None:
        plain = [c for c in children if _content_type(c) == "text/plain"]
        if plain and _text_of(plain[0]).strip():
            self.walk(plain[0], depth + 1)
            return
        rich = [c for c in children if _content_type(c) != "text/plain"]
        if rich:
            self.walk(rich[-1], depth + 1)  # the last alternative is the richest
        elif children:
            self.walk(children[0], depth + 1)

    @staticmethod
    def _is_attachment(part: Message, ctype: str) -> bool:
        disposition = (part.get_content_disposition() or "").lower()
        if disposition == "attachment":
            return True
        return not ctype.startswith("text/") and not ctype.startswith("multipart/")

    def _attachment(self, part: Message, ctype: str) -> None:
        data = _payload_bytes(part)
        filename = _filename(part, ctype, len(self.attachments) + 1)
        kept = data if len(data) <= self.cap else None
        text = None
        if kept is not None and is_text_attachment(ctype, filename):
            text = decode(kept, _charset(part))
            if ctype == "text/html" or filename.lower().endswith((".html", ".htm")):
                text = html_to_text(text)
        self.attachments.append(Attachment(filename, ctype, len(data), kept, text))


def is_text_attachment(ctype: str, filename: str) -> bool:
    ext = posixpath.splitext(filename.lower())[1]
    return ctype.startswith("text/") or ctype in TEXTY_TYPES or ext in TEXTY_EXTENSIONS


def _content_type(part: Message) -> str:
    try:
        return part.get_content_type().lower()
    except Exception:
        return "text/plain"


def _charset(part: Message) -> str | None:
    try:
        return part.get_content_charset()
    except Exception:  # e.g. a non-ASCII charset parameter
        return None


def _payload_bytes(part: Message) -> bytes:
    try:
        data = part.get_payload(decode=True)
    except Exception:  # a transfer encoding that cannot be undone
        data = None
    if isinstance(data, bytes):
        return data
    payload = part.get_payload()
    if isinstance(payload, str):
        return payload.encode("utf-8", "surrogateescape")
    return b""


def _text_of(part: Message) -> str:
    return decode(_payload_bytes(part), _charset(part))


def _filename(part: Message, ctype: str, n: int) -> str:
    try:
        name = part.get_filename()
    except Exception:
        name = None
    name = headers.text(str(name)) if name else ""
    name = posixpath.basename(name.replace("\\", "/")).strip()
    name = re.sub(r"[\x00-\x1f\x7f]", "", name)[:200]
    if not name:
        name = f"attachment-{n}{mimetypes.guess_extension(ctype) or '.bin'}"
    return name


XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>", re.IGNORECASE)


def html_to_text(markup: str) -> str:
    """Readable text of an HTML body: inscriptis keeps lists, tables and paragraphs
    apart; a crude tag strip when it gives up."""
    markup = XML_DECLARATION.sub("", markup)
    if not markup.strip():
        return ""
    try:
        result = get_text(markup)
    except Exception:  # lxml refuses some documents
        result = html.unescape(re.sub(r"<[^>]*>", " ", markup))
    lines = [line.rstrip() for line in result.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
