"""Reading Authentication-Results headers (RFC 8601) the way the RFC writes them:

    Authentication-Results: mx.example.com (comment) 1;
        spf=pass smtp.mailfrom="a;b"@example.com;
        dkim=pass (good signature) header.d=example.com header.s=sel;
        dmarc=pass header.from=example.com

and whose of them to believe. The first field is the authserv-id of the server that did the
checks (Microsoft writes none: its header starts with `spf=`). Fields are split on `;`
outside quoted strings and comments (which nest); a property's value may be a quoted string.

Whose headers count (`Receiver`): the receiving server prepends its headers, so they sit
above everything the sender wrote; a header claiming "pass" further down may be the
sender's own. The receiving server is the one `[email] authserv_id` names, else the one
the IMAP host belongs to (`KNOWN`: Gmail, Fastmail, iCloud, Outlook.com), else the one
that wrote the topmost header (`learn`; only good for failures: a server that checks
nothing leaves the sender's own header on top). Per check, the topmost of the receiving
server's headers that reports it decides (`verdict`); Gmail and Microsoft write one header
only, so below their first nothing counts. Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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
    """(authserv-id lower case, results). A header whose first field is already a result
    (Microsoft's) gives ("", results); one with no usable first field gives ("", [])."""
    fields = _fields(value)
    head = fields[0].split()
    if "=" in fields[0]:
        server, rest = "", fields  # no authserv-id: the first field is a result
    elif not head or not _TOKEN.fullmatch(head[0]):
        return "", []
    else:
        server, rest = head[0].lower().rstrip("."), fields[1:]
    results = []
    for field in rest:
        pairs = _pairs(field)
        if not pairs:
            continue  # "none" (no checks done), or noise
        (method, result), props = pairs[0], dict(pairs[1:])
        results.append(Result(method.split("/")[0], result.lower(), props))
    return server, results


@dataclass(frozen=True)
class Receiver:
    """The receiving server: which authserv-ids are its own."""
    name: str  # as a reason shows it
    ids: re.Pattern[str]  # matches (fully) each of its authserv-ids; "" = none written
    one_header: bool = False  # writes all its results in one header: only its topmost counts
    imap_hosts: tuple[str, ...] = ()

    def owns(self, server: str) -> bool:
        return self.ids.fullmatch(server) is not None


KNOWN = (
    Receiver("mx.google.com", re.compile(r"mx\.google\.com"), one_header=True,
             imap_hosts=("imap.gmail.com", "imap.googlemail.com")),
    # Fastmail: several headers under one mxN id (x-ptr, bimi, arc, then dkim/dmarc/spf).
    Receiver("messagingengine.com", re.compile(r"(?:[\w-]+\.)*messagingengine\.com"),
             imap_hosts=("imap.fastmail.com", "mail.messagingengine.com")),
    # iCloud: one header per check (bimi., arc., dmarc., dkim-verifier., spf.icloud.com).
    Receiver("icloud.com", re.compile(r"(?:[\w-]+\.)*icloud\.com"),
             imap_hosts=("imap.mail.me.com",)),
    # Microsoft: one header with no authserv-id at all (`spf=pass (sender IP is ...) ...`).
    Receiver("Outlook.com", re.compile(r"|mx\.microsoft\.com|(?:[\w-]+\.)+outlook\.com"),
             one_header=True, imap_hosts=("outlook.office365.com", "imap-mail.outlook.com")),
)


def receiver(authserv_id: str, imap_host: str) -> Receiver | None:
    """The receiving server as configured: `authserv_id` (one or more ids, separated by
    commas or spaces), else the provider `imap_host` belongs to; None when neither says."""
    ids = [i.lower().rstrip(".") for i in re.split(r"[,\s]+", authserv_id) if i]
    if ids:
        known = [k for k in KNOWN if all(k.owns(i) for i in ids)]
        return Receiver(", ".join(ids), re.compile("|".join(map(re.escape, ids))),
                        one_header=bool(known) and known[0].one_header)
    host = imap_host.strip().lower().rstrip(".")
    return next((k for k in KNOWN if host in k.imap_hosts), None)


def learn(server: str) -> Receiver:
    """The receiving server as the topmost header names it: a known provider's whole set
    of ids, else that one id."""
    known = next((k for k in KNOWN if k.owns(server)), None)
    return known or Receiver(server or "the receiving server", re.compile(re.escape(server)))


class Verdict(NamedTuple):
    receiver: Receiver | None  # None: no Authentication-Results header at all
    found: bool  # the receiving server wrote at least one header
    checks: dict[str, tuple[str, list[Result]]]  # method -> (authserv-id, its results)

    def results(self, method: str) -> list[Result]:
        return self.checks.get(method, ("", []))[1]

    def by(self, method: str) -> str:
        """Who reported `method`, for a reason."""
        return self.checks[method][0] or (self.receiver.name if self.receiver else "")


def verdict(values: list[str], server: Receiver | None) -> Verdict:
    """The receiving server's results among the Authentication-Results header `values`
    (in header order, topmost first). `server` None: learned from the topmost header."""
    parsed = [parse(v) for v in values]
    if server is None:
        if not parsed:
            return Verdict(None, False, {})
        server = learn(parsed[0][0])
    found, checks = False, {}
    for authserv_id, results in parsed:
        if not server.owns(authserv_id):
            continue
        found = True
        here: dict[str, list[Result]] = {}
        for result in results:
            here.setdefault(result.method, []).append(result)
        for method, reported in here.items():
            checks.setdefault(method, (authserv_id, reported))  # the topmost report counts
        if server.one_header:
            break
    return Verdict(server, found, checks)
