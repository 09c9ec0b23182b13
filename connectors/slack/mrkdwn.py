"""Markdown (what models write) to Slack's mrkdwn, and long answers split into messages.

    **bold** / __bold__      *bold*
    *italic* / _italic_      _italic_
    ~~strike~~               ~strike~
    [text](url), ![alt](u)   <url|text>
    # Heading                *Heading*
    - item / * item          • item        (nested items keep their indent)
    ```lang ... ```          ``` ... ```   (code is never touched)
    & < >                    &amp; &lt; &gt;  (except Slack's own <@U…>, <#C…>, <http…>)

`render` also takes the ping out of broadcast mentions (`<!channel>`, `<!here>`,
`<!everyone>`, `<!subteam^…>` user groups) anywhere in an answer, code included, unless
`[slack] allow_broadcast_mentions`: a model that repeats or invents one must not notify a
whole channel. They are shown as the words Slack users know ("@channel", "@ops"), so the
answer still reads as written, with a zero-width space after the "@": a bare "@channel"
is only plain text while messages are posted without `parse=full` or `link_names`, the
zero-width space keeps it plain under any of them. A bare "@here" the model writes gets
the same.
"""

from __future__ import annotations

import re

LIMIT = 3500  # characters per Slack message (Slack shows 4000 before it truncates)

_FENCE = re.compile(r"^(\s*)```")
_SLACK_TOKEN = re.compile(r"<(?:[@#!][^>\s]+|(?:https?|mailto):[^>\s]+)>")
_LINK = re.compile(r"!?\[([^\]\n]+)\]\((\S+?)(?:\s+\"[^\"]*\")?\)")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]+)>")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|(?<!\w)__(?=\S)(.+?)(?<=\S)__(?!\w)")
_ITALIC_STAR = re.compile(r"(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_QUOTE = re.compile(r"^(\s*>+\s?)(.*)$")
_BROADCAST = re.compile(r"<!(here|channel|everyone|group)(?:\|[^>]*)?>")
_GROUP_MENTION = re.compile(r"<!subteam\^[^>|]*(?:\|@?([^>]*))?>")
_BARE_BROADCAST = re.compile(r"(?<![\w@])@(here|channel|everyone)\b")
NO_PING = "\u200b"  # zero-width space: after an "@", the word is never a mention


def to_mrkdwn(markdown: str) -> str:
    out: list[str] = []
    in_code = False
    for line in markdown.split("\n"):
        fence = _FENCE.match(line)
        if fence:
            in_code = not in_code
            out.append(fence.group(1) + "```")  # Slack shows no language tag
            continue
        out.append(line if in_code else _line(line))
    return "\n".join(out)


def _line(line: str) -> str:
    if _RULE.match(line):
        return "──────────"
    heading = _HEADING.match(line)
    if heading:
        return f"*{_inline(re.sub(r'[*_]{2}', '', heading.group(1)))}*"
    bullet = _BULLET.match(line)
    if bullet:
        return f"{bullet.group(1)}• {_inline(bullet.group(2))}"
    quote = _QUOTE.match(line)
    if quote:
        return "> " + _inline(quote.group(2))
    return _inline(line)


def _inline(text: str) -> str:
    kept: list[str] = []

    def keep(value: str) -> str:
        kept.append(value)
        return f"\x00{len(kept) - 1}\x00"

    text = _INLINE_CODE.sub(lambda m: keep(m.group(0)), text)
    text = _SLACK_TOKEN.sub(lambda m: keep(m.group(0)), text)
    text = _LINK.sub(lambda m: keep(f"<{m.group(2)}|{_escape(m.group(1))}>"), text)
    text = _AUTOLINK.sub(lambda m: keep(f"<{m.group(1)}>"), text)
    text = _escape(text)
    text = _BOLD.sub(lambda m: f"\x01{m.group(1) or m.group(2)}\x01", text)
    text = _ITALIC_STAR.sub(lambda m: f"_{m.group(1)}_", text)
    text = _STRIKE.sub(lambda m: f"~{m.group(1)}~", text)
    text = text.replace("\x01", "*")
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], text)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def split(text: str, limit: int = LIMIT) -> list[str]:
    """Messages of at most `limit` characters, cut at a paragraph, line or word boundary.
    A code block cut in two is closed and reopened. Each cut depends only on the text up
    to it, so a streamed prefix is cut where the whole answer will be."""
    parts: list[str] = []
    rest = text
    while len(rest) > limit:
        window = rest[:limit - 4]  # room to close a code block
        cut = _cut_point(window)
        part, rest = rest[:cut].rstrip(), rest[cut:].lstrip("\n")
        if part.count("```") % 2:
            part += "\n```"
            rest = "```\n" + rest
        parts.append(part)
    parts.append(rest)
    return parts


def _cut_point(window: str) -> int:
    half = len(window) // 2
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > half:
            return at + len(sep)
    return len(window)


def without_broadcasts(mrkdwn: str) -> str:
    """`mrkdwn` with every broadcast mention shown as its word, never a ping."""
    text = _BROADCAST.sub(lambda m: f"@{NO_PING}{m.group(1)}", mrkdwn)
    text = _GROUP_MENTION.sub(lambda m: f"@{NO_PING}{(m.group(1) or '').strip() or 'group'}",
                              text)
    return _BARE_BROADCAST.sub(lambda m: f"@{NO_PING}{m.group(1)}", text)


def render(markdown: str, limit: int = LIMIT, *, allow_broadcast: bool = False) -> list[str]:
    """An answer as the Slack messages that show it (broadcast mentions defused unless
    `allow_broadcast`)."""
    text = to_mrkdwn(markdown.strip())
    if not allow_broadcast:
        text = without_broadcasts(text)
    return split(text or " ", limit)
