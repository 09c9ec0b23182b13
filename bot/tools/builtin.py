"""The built-in tools: the clock, a web page fetch, and the conversation's to-do list."""

from __future__ import annotations

import asyncio
import re
import zlib
from datetime import datetime
from html.parser import HTMLParser
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import httpx
from pydantic import Field

from bot.provenance import MARK, first, marked
from bot.runtime.definitions import Policy
from bot.tools.base import Tool, ToolContext, ToolResult, tool
from bot.tools.guarded_http import guarded_client
from bot.tools.items import ensure_ids, find_index, numbers_hint, take_id
from bot.tools.netguard import NetGuard
from bot.tools.permissions import NETWORK, READS_OUTSIDE, REMEMBERS, Asking
from store import NotFound, conversation_namespace
from store.documents import Draft

__all__ = ["builtin_tools", "current_time", "http_get", "todo"]


# -- current_time -------------------------------------------------------------------------


async def _zone(name: str) -> ZoneInfo:
    try:
        # the first load of a zone reads a file: keep it off the event loop
        return await asyncio.to_thread(ZoneInfo, name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown timezone {name!r} (use an IANA name such as "
                         "'Europe/Paris')") from None


@tool(policy=Policy.SAFE)
async def current_time(
    ctx: ToolContext,
    timezone: Annotated[str | None, Field(
        description="IANA timezone to ask about, e.g. 'America/New_York'; "
                    "default: the user's own")] = None,
) -> str:
    """The current date and time (ISO 8601 with UTC offset, weekday, timezone), in the
    user's timezone unless another is given."""
    name = timezone or ctx.timezone
    now = datetime.now(await _zone(name))
    return f"{now.isoformat(timespec='seconds')} {now:%A}, timezone {name} ({now:%Z})"


# -- http_get -----------------------------------------------------------------------------

HTTP_TIMEOUT = 15.0
MAX_REDIRECTS = 5
MAX_BYTES_CAP = 1_000_000
ACCEPT_ENCODING = "gzip, deflate"  # what _Inflate decodes, a bounded piece at a time
PUBLIC_ONLY = NetGuard()  # no [agent] http_allow: public addresses only
_WHITESPACE = re.compile(r"\s+")
_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg"})
_BLOCKS = frozenset({
    "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "fieldset",
    "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
    "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table", "td", "th", "title",
    "tr", "ul",
})


class _TextOfHTML(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0
        self._pre = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _SKIPPED:
            self._skipping += 1
        elif tag in _BLOCKS:
            self._pre += tag == "pre"
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in _BLOCKS:
            self._pre = max(0, self._pre - (tag == "pre"))
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            # outside <pre>, a line break in the source is just a space
            self.parts.append(data if self._pre else _WHITESPACE.sub(" ", data))


def html_to_text(html: str) -> str:
    """Readable text of an HTML page: no scripts or styles, one line per block, whitespace
    collapsed."""
    parser = _TextOfHTML()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


async def _fetch(http: httpx.AsyncClient, url: str, max_bytes: int):
    """(response, body, truncated) after following up to MAX_REDIRECTS redirects, each hop
    through the guarded client; at most max_bytes of the decoded body are read."""
    for _ in range(MAX_REDIRECTS + 1):
        _check_scheme(url)
        async with http.stream("GET", url, headers={"Accept-Encoding": ACCEPT_ENCODING},
                               timeout=HTTP_TIMEOUT) as response:
            location = response.headers.get("location")
            if response.is_redirect and location:
                url = str(response.url.join(location))
                continue
            body, truncated = await _read_body(response, max_bytes)
            # leaving the block closes the connection: the rest is never read
            return response, body, truncated
    raise ValueError(f"more than {MAX_REDIRECTS} redirects")


async def _read_body(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """The body decoded, cut at max_bytes: decompression stops there too (a few KB of gzip
    can inflate to gigabytes), so memory stays within max_bytes plus one raw chunk."""
    inflate = _Inflate.for_encoding(response.headers.get("content-encoding", ""))
    body = bytearray()
    async for raw in response.aiter_raw(chunk_size=64 * 1024):
        while raw and len(body) <= max_bytes:
            if inflate is None:
                body += raw[:max_bytes + 1 - len(body)]
                break
            out, raw = inflate.take(raw, max_bytes + 1 - len(body))
            body += out
        if len(body) > max_bytes:
            del body[max_bytes:]
            return bytes(body), True
    return bytes(body), False


class _Inflate:
    """gzip or deflate, decoded a bounded piece at a time (httpx's own decoders inflate a
    whole network chunk at once, however large that makes it)."""

    GZIP, ZLIB, RAW = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS, -zlib.MAX_WBITS

    def __init__(self, wbits: int, name: str):
        self.wbits, self.name = wbits, name
        self._z = zlib.decompressobj(wbits)  # None between gzip members
        self._started = False

    @classmethod
    def for_encoding(cls, header: str) -> _Inflate | None:
        codings = [c.strip().lower() for c in header.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if not codings:
            return None
        if codings in (["gzip"], ["x-gzip"]):
            return cls(cls.GZIP, "gzip")
        if codings == ["deflate"]:
            return cls(cls.ZLIB, "deflate")
        raise ValueError(f"cannot decode content-encoding {header.strip()!r}")

    def take(self, data: bytes, limit: int) -> tuple[bytes, bytes]:
        """At most `limit` (>= 1) decoded bytes of `data`, and the input not used yet."""
        if self._z is None:  # between gzip members, or past the end of the stream
            if self.wbits != self.GZIP or data[:1] != b"\x1f":
                return b"", b""  # what follows the end of the stream is not body
            self._z = zlib.decompressobj(self.GZIP)  # the next member
        try:
            out = self._z.decompress(data, limit)
        except zlib.error:
            if self.wbits != self.ZLIB or self._started:
                raise ValueError(f"the body is not valid {self.name} data") from None
            # "deflate" as some servers send it: without the zlib wrapper
            self.wbits, self._z = self.RAW, zlib.decompressobj(self.RAW)
            return self.take(data, limit)
        self._started = True
        if not self._z.eof:
            return out, self._z.unconsumed_tail
        rest, self._z = self._z.unused_data, None
        return out, rest


def _check_scheme(url: str) -> None:
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in ("http", "https"):
        raise ValueError(f"only http and https URLs can be fetched, not {url[:100]!r}")


def _decode(body: bytes, charset: str | None) -> str:
    try:
        return body.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return body.decode("utf-8", errors="replace")


@tool(policy=Policy.SAFE, touches=frozenset({NETWORK, READS_OUTSIDE}))
async def http_get(
    ctx: ToolContext,
    url: Annotated[str, Field(description="an http:// or https:// URL")],
    max_bytes: Annotated[int, Field(
        description=f"read at most this many bytes of the body (at most {MAX_BYTES_CAP:,})",
        ge=1)] = 100_000,
) -> str:
    """Fetch a web page or file with an HTTP GET and return its status, final URL, content
    type and text (HTML is reduced to readable text). Only public addresses can be reached
    (and LAN hosts the owner allowed)."""
    _check_scheme(url)
    max_bytes = min(max_bytes, MAX_BYTES_CAP)
    # Not ctx.http: this client connects only to addresses the guard allows, and to the
    # very address it checked.
    guard = ctx.netguard or PUBLIC_ONLY
    try:
        async with asyncio.timeout(HTTP_TIMEOUT), guarded_client(guard) as http:
            response, body, truncated = await _fetch(http, url, max_bytes)
    except TimeoutError:
        raise TimeoutError(f"no complete response within {HTTP_TIMEOUT:g} s") from None
    content_type = response.headers.get("content-type", "")
    text = _decode(body, response.charset_encoding)
    if "html" in content_type.lower():
        text = await asyncio.to_thread(html_to_text, text)
    lines = [
        f"status: {response.status_code} {response.reason_phrase}".rstrip(),
        f"url: {response.url}",
        f"content-type: {content_type or '(none)'}",
        "",
        text,
    ]
    if truncated:
        lines.append(f"\n[truncated: only the first {max_bytes:,} bytes of the body were read]")
    return "\n".join(lines)


# -- todo ---------------------------------------------------------------------------------

TODO_DOCUMENT = "todo"


def render_todo(items: list[dict]) -> ToolResult:
    """One line per item, numbered by the item's id (its number for good); an item added
    from outside text (bot.provenance) says so, and so does the result."""
    if not items:
        return ToolResult("The to-do list is empty.")
    return ToolResult("\n".join(
        f"{item.get('id', n)}. [{'x' if item.get('done') else ' '}] "
        + (f"[text from outside ({item[MARK]}): data] " if item.get(MARK) else "")
        + f"{item.get('text', '')}" for n, item in enumerate(items, 1)),
        outside=first(item.get(MARK) for item in items))


async def _removing_after_outside(asking: Asking, action: str = "", number: int | None = None,
                                  **_args) -> str | None:
    """Taking an item off the person's list, asked for by outside text."""
    if action != "remove" or not asking.read_outside:
        return None
    return (f"remove item {number} from the to-do list, asked for after reading text from "
            f"outside (via {asking.read_outside}), which may be trying to make me do it")


@tool(policy=Policy.SAFE, touches=frozenset({REMEMBERS}), approval=_removing_after_outside)
async def todo(
    ctx: ToolContext,
    action: Annotated[Literal["add", "complete", "reopen", "remove", "list"], Field(
        description="what to do with the list")],
    item: Annotated[str | None, Field(description="the text of the item to add")] = None,
    number: Annotated[int | None, Field(
        description="the item's number as the list shows it, for complete, reopen and "
                    "remove")] = None,
) -> ToolResult:
    """The to-do list of this conversation: add an item, complete, reopen or remove one by
    its number, or list them. Returns the list as it is afterwards. An item keeps its
    number for good: removing item 2 leaves item 3 numbered 3, so several calls at once
    can each name the numbers you saw."""
    # Safe to repeat: the only effect is the document edit, which lands with the result.
    # The edit is made against the version read here; if a parallel call's edit lands
    # first, the commit refuses this one (DocumentConflict) and the runtime runs the call
    # again on the new version, where the item numbers (ids) still mean the same items.
    if ctx.conversation_id is None:
        raise ValueError("the to-do list belongs to a conversation, and there is none here")
    namespace = conversation_namespace(ctx.conversation_id)
    try:
        read = await ctx.store.read_document(namespace, TODO_DOCUMENT)
        current, base_version = read.value, read.version
    except NotFound:
        current, base_version = {"items": []}, 0
    if not isinstance(current, dict):
        raise ValueError(f"the stored to-do list is a {type(current).__name__}, not an object")
    draft = Draft(current)
    if not isinstance(current.get("items"), list):
        draft.root["items"] = []  # a repair, recorded like any edit
    ensure_ids(draft.root)  # a list from before ids gets them, numbered as it was shown
    upkeep = len(draft.ops)
    items = draft.root["items"]

    if action == "add":
        text = (item or "").strip()
        if not text:
            raise ValueError("add needs `item`: the text of the new item")
        items.append({"id": take_id(draft.root), "text": text, "done": False,
                      **marked(ctx.outside)})
    elif action in ("complete", "reopen", "remove"):
        index = None if number is None else find_index(items[:], number)
        if index is None:
            hint = numbers_hint(items[:], "item")
            if number is None:
                raise ValueError(f"{action} needs `number`, the item's number as the list "
                                 f"shows it ({hint})")
            raise ValueError(f"there is no item {number} on the to-do list ({hint})")
        if action == "remove":
            del items[index]
        else:
            done = action == "complete"
            if items[index].get("done") is not done:
                items[index]["done"] = done

    if len(draft.ops) > upkeep:  # something changed (not just ids given to an old list)
        ctx.writes.edit_document(namespace, TODO_DOCUMENT, draft.ops, initial={"items": []},
                                 history="rewindable", fork_policy="as_of",
                                 conversation_id=ctx.conversation_id,
                                 base_version=base_version)
    return render_todo(draft.value["items"])


def builtin_tools() -> list[Tool]:
    return [current_time, http_get, todo]
