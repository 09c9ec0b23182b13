"""Reading an Authentication-Results header (RFC 8601) the way the RFC writes it:

    Authentication-Results: mx.example.com (comment) 1;
        spf=pass smtp.mailfrom="a;b"@example.com;
        dkim=pass (good signature) header.d=example.com header.s=sel;
        dmarc=pass header.from=example.com

The first field is the authserv-id of the server that did the checks; a header from any
other server, or with none, was written by whoever sent the mail and proves nothing. Fields
are split on `;` outside quoted strings and comments (which nest); a property's value may
be a quoted string. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_TOKEN = re.compile(r"[^\s=;()\"]+")


class Result(NamedTuple):
    method: str  # "spf", "dkim", "dmarc", ... (lower case, version dropped)
    result: str  # "pass", "fail", "none", ... (lower case)
    props: dict[str, str]  # "header.d" -> "example.com" (names lower case)


def _fields(value: str) -> list[str]:
    """The `;`-separated fields, comments dropped, quoted strings kept (with quotes)."""
    fields, current, depth, quoted, escaped = [], [], 0, False, False
    for ch in value:
        if escaped:
            if depth == 0:
                current.append(ch)
            escaped = False
        elif ch == "\\" and (quoted or depth):
            escaped = True
            if depth == 0:
                current.append(ch)
        elif quoted:
            current.append(ch)
            quoted = ch != '"'
        elif ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif depth:
            continue
        elif ch == '"':
            quoted = True
            current.append(ch)
        elif ch == ";":
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
    fields.append("".join(current))
    return [" ".join(f.split()) for f in fields]


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _pairs(text: str) -> list[tuple[str, str]]:
    """`name = value` pairs of one field, values possibly quoted (or ending in a quoted
    local part, as `"x;y"@example.com`)."""
    out, i = [], 0
    pair = re.compile(r'\s*([^\s=]+)\s*=\s*((?:"(?:[^"\\]|\\.)*"|[^\s"])+)')
    while (m := pair.match(text, i)) is not None:
        out.append((m.group(1).lower(), _unquote(m.group(2))))
        i = m.end()
    return out


def parse(value: str) -> tuple[str, list[Result]]:
    """(authserv-id lower case, results). A header with no usable authserv-id gives ("", [])."""
    fields = _fields(value)
    head = fields[0].split()
    if not head or not _TOKEN.fullmatch(head[0]) or "=" in fields[0]:
        return "", []
    results = []
    for field in fields[1:]:
        pairs = _pairs(field)
        if not pairs:
            continue  # "none" (no checks done), or noise
        (method, result), props = pairs[0], dict(pairs[1:])
        results.append(Result(method.split("/")[0], result.lower(), props))
    return head[0].lower().rstrip("."), results
