"""Streaming XML for the office readers: expat fed in chunks from a size-capped stream,
callbacks per element, and no document type declarations at all (office parts never have
one; refusing them rules out entity-expansion bombs).

Bounded in depth and in count: expat keeps every open element on its stack, so a few
kilobytes of zipped `<a><a><a>…` would otherwise hold gigabytes; and each element costs
a call into Python, so a part of millions of empty elements is refused at `ELEMENTS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO
from xml.parsers import expat

from .errors import TooLarge, Unreadable

CHUNK = 64 * 1024
DEPTH = 1_000  # open elements at once (Word nests tables at most 63 deep)
ELEMENTS = 2_000_000  # elements read from one document, all its parts together
NO_MEMORY = expat.errors.codes[expat.errors.XML_ERROR_NO_MEMORY]

Start = Callable[[str, dict[str, str]], None]  # (local name, attributes by local name)
End = Callable[[str], None]
Text = Callable[[str], None]


class Enough(Exception):
    """Raised by a callback: the caller has all the text it wants."""


def walk(stream: IO[bytes], *, limit: int, start: Start, end: End, text: Text,
         depth: int = DEPTH, elements: int = ELEMENTS) -> int:
    """Feed `stream` (at most `limit` bytes) to the callbacks; the number of elements
    read is returned (for the caller's budget of `elements` across parts)."""
    parser = expat.ParserCreate(namespace_separator=" ")
    count = 0
    open_now = 0

    def refuse(*_args) -> None:
        raise Unreadable("the document declares a DTD or entities (refused)")

    def started(name: str, attrs: dict[str, str]) -> None:
        nonlocal count, open_now
        count += 1
        open_now += 1
        if open_now > depth:
            raise TooLarge(f"the document's XML is nested deeper than {depth} elements")
        if count > elements:
            raise TooLarge(f"the document has more than {elements} elements")
        start(_local(name), {_local(k): v for k, v in attrs.items()})

    def ended(name: str) -> None:
        nonlocal open_now
        open_now -= 1
        end(_local(name))

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.StartElementHandler = started
    parser.EndElementHandler = ended
    parser.CharacterDataHandler = text
    read = 0
    try:
        while chunk := stream.read(CHUNK):
            read += len(chunk)
            if read > limit:
                raise TooLarge(f"a part of the document inflates past {limit} bytes")
            parser.Parse(chunk, False)
        parser.Parse(b"", True)
    except Enough:
        return count
    except expat.ExpatError as exc:
        if exc.code == NO_MEMORY:
            raise TooLarge("the document's XML needs more memory than Steward gives one "
                           "file") from None
        raise Unreadable(f"the document's XML is broken ({exc})") from None
    return count


def _local(name: str) -> str:
    return name.rpartition(" ")[2]
