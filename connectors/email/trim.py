"""What the model reads of a message body: the new text, without the quoted history and
the signature. The full text is kept in the store; this only shapes the prompt.

Top-posted replies are cut at the attribution line ("On ... wrote:", Outlook's "-----Original
Message-----" or "From: ... Sent: ..." block); inline replies (answers between quoted lines)
keep their quotes, since the answers make no sense without them. A trailing run of "> "
lines, the signature after "-- " and "Sent from my ..." lines are dropped.
"""

import re

ATTRIBUTION = re.compile(
    r"^\s*(On\s.+\swrote:|Am\s.+\sschrieb\s.+:|Le\s.+\sa\s+écrit\s*:|El\s.+\sescribió:"
    r"|Op\s.+\sschreef\s.+:|Il\s.+\sha\s+scritto:|.+\s<[^>]+>\s+wrote:)\s*$",
    re.IGNORECASE)
ORIGINAL = re.compile(r"^\s*(-{2,}\s*Original Message\s*-{2,}|_{20,})\s*$", re.IGNORECASE)
OUTLOOK_HEADER = re.compile(r"^\s*\**(From|Von|De)\s*:\**\s.+", re.IGNORECASE)
OUTLOOK_NEXT = re.compile(r"^\s*\**(Sent|Date|Gesendet|Envoyé|To|Subject)\s*:", re.IGNORECASE)
SENT_FROM = re.compile(r"^\s*(Sent from my |Get Outlook for |Sent from Mail for )", re.IGNORECASE)
SIGNATURE = re.compile(r"^--\s?$")


def is_quoted(line: str) -> bool:
    return line.lstrip().startswith(">")


def _history_start(lines: list[str]) -> int | None:
    """Index of the line where quoted history begins, if the reply is top-posted."""
    for i, line in enumerate(lines):
        joined = line if i + 1 >= len(lines) else f"{line} {lines[i + 1].strip()}"
        if ATTRIBUTION.match(line) or (line.strip().lower().startswith(("on ", "am ", "le "))
                                       and ATTRIBUTION.match(joined)):
            rest = lines[i + (1 if ATTRIBUTION.match(line) else 2):]
            if any(s.strip() and not is_quoted(s) for s in rest):
                return None  # inline answers follow: the quotes are part of the reply
            return i
        if ORIGINAL.match(line):
            return i
        if (OUTLOOK_HEADER.match(line) and i + 1 < len(lines)
                and OUTLOOK_NEXT.match(lines[i + 1])):
            return i
    return None


def trim(text: str) -> str:
    """The part of `text` worth showing the model; `text` itself if nothing would be left."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    cut = _history_start(lines)
    if cut is not None:
        lines = lines[:cut]
    for i in range(len(lines) - 1, -1, -1):  # the last signature delimiter
        if SIGNATURE.match(lines[i]):
            lines = lines[:i]
            break
    while lines and (not lines[-1].strip() or is_quoted(lines[-1])
                     or SENT_FROM.match(lines[-1])):
        lines.pop()
    trimmed = "\n".join(lines).strip()
    return trimmed or text.strip()
