"""Header values of real mail as clean text: RFC 2047 encoded words in any charset, raw
8-bit bytes, folding, broken encodings. Also the message-id lists threading needs."""

import hashlib
import re
from email.header import decode_header
from email.message import Message
from email.utils import getaddresses

from connectors.email.charsets import decode

MSG_ID = re.compile(r"<([^<>\s]+)>")
# Starts only where a run of local-part characters starts: linear on long junk, same matches.
ADDRESS = re.compile(r"(?<![\w.!#$%&'*+/=?^`{|}~-])[\w.!#$%&'*+/=?^`{|}~-]+@[\w-]+(?:\.[\w-]+)+")
ENCODED_WORD = re.compile(r"=\?[^?\s]*\?[bBqQ]\?[^?\s]*\?=")
MAX_ID = 400  # store columns hold 512 characters; longer ids are hashed


def all_raw(msg: Message, name: str) -> list[str]:
    """Every value of a header as the parser read it (8-bit bytes as surrogate escapes,
    encoded words not yet decoded), in order."""
    wanted = name.lower()
    return [str(v) for k, v in msg.raw_items() if k.lower() == wanted]


def raw(msg: Message, name: str) -> str | None:
    values = all_raw(msg, name)
    return values[0] if values else None


def text(value: str | None) -> str:
    """Decoded, unfolded text of a header value. Never raises."""
    if not value:
        return ""
    try:
        chunks = decode_header(value)
    except Exception:  # malformed encoded words: show them as they are
        chunks = [(value, None)]
    out = []
    for chunk, charset in chunks:
        if isinstance(chunk, str):
            chunk = chunk.encode("utf-8", "surrogateescape")
        out.append(decode(chunk, charset))
    return " ".join("".join(out).split())


def header(msg: Message, name: str) -> str:
    return text(raw(msg, name))


def clip(identifier: str) -> str:
    """An id short enough for the store, stable: long ones become their hash."""
    if len(identifier) <= MAX_ID:
        return identifier
    return "sha256:" + hashlib.sha256(identifier.encode("utf-8", "surrogateescape")).hexdigest()


def message_ids(value: str | None) -> list[str]:
    """The message ids in a Message-ID / In-Reply-To / References value, in order, without
    angle brackets. A bare id without brackets (broken clients) is taken as is."""
    if not value:
        return []
    value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    found = MSG_ID.findall(value)
    if not found:
        bare = value.strip()
        found = [bare] if "@" in bare and not any(c.isspace() for c in bare) else []
    seen: list[str] = []
    for identifier in found:
        identifier = clip(identifier)
        if identifier not in seen:
            seen.append(identifier)
    return seen


def address(msg: Message, name: str = "From") -> tuple[str, str]:
    """(display name, lower-cased address) of the first address in a header; ("", "") if
    there is none. Parsed before decoding so an encoded comma in a name cannot split it."""
    value = raw(msg, name)
    if not value:
        return "", ""
    value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    angle = re.search(r"<\s*(" + ADDRESS.pattern + r")\s*>", value)
    if angle:
        display = text(value[:angle.start()]).strip().strip('"').strip()
        return display[:200], angle.group(1).lower()
    try:
        pairs = getaddresses([value])
    except Exception:
        pairs = []
    for display, addr in pairs:
        if "@" in addr and ADDRESS.fullmatch(addr.strip()):
            return text(display)[:200], addr.strip().lower()
    match = ADDRESS.search(value)
    return ("", match.group(0).lower()) if match else ("", "")


def addresses(msg: Message, name: str = "From") -> list[str]:
    """Every distinct address (lower-cased, in order) in every `name` header. Quoted
    strings, comments and encoded words are display text, not addresses: `"a@x" <b@y>`
    holds one address, `a@x, b@y` and `a@x <b@y>` two."""
    found: list[str] = []
    for value in all_raw(msg, name):
        value = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        for addr in ADDRESS.findall(_outside_quotes(ENCODED_WORD.sub(" ", value))):
            if addr.lower() not in found:
                found.append(addr.lower())
    return found


def _outside_quotes(value: str) -> str:
    """`value` with its quoted strings and (nested) comments blanked out."""
    out, depth, quoted, escaped = [], 0, False, False
    for ch in value:
        if escaped:
            escaped = False
        elif ch == "\\" and (quoted or depth):
            escaped = True
        elif quoted:
            quoted = ch != '"'
        elif ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif not depth and ch == '"':
            quoted = True
        elif not depth:
            out.append(ch)
            continue
        out.append(" ")
    return "".join(out)
