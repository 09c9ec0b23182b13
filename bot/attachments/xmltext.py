"""Streaming XML for the office readers: expat fed in chunks from a size-capped stream,
callbacks per element, and no document type declarations at all (office parts never have
one; refusing them rules out entity-expansion bombs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO
from xml.parsers import expat

from .errors import TooLarge, Unreadable

CHUNK = 64 * 1024

Start = Callable[[str, dict[str, str]], None]  # (local name, attributes by local name)
End = Callable[[str], None]
Text = Callable[[str], None]


class Enough(Exception):
    """Raised by a callback: the caller has all the text it wants."""


def walk(stream: IO[bytes], *, limit: int, start: Start, end: End, text: Text) -> None:
    parser = expat.ParserCreate(namespace_separator=" ")

    def refuse(*_args) -> None:
        raise Unreadable("the document declares a DTD or entities (refused)")

    parser.StartDoctypeDeclHandler = refuse
    parser.EntityDeclHandler = refuse
    parser.StartElementHandler = lambda name, attrs: start(
        _local(name), {_local(k): v for k, v in attrs.items()})
    parser.EndElementHandler = lambda name: end(_local(name))
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
        return
    except expat.ExpatError as exc:
        raise Unreadable(f"the document's XML is broken ({exc})") from None


def _local(name: str) -> str:
    return name.rpartition(" ")[2]
