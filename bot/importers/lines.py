"""Reading a binary file line by line with a bound on the line length, so one enormous
line (a file with no newlines at all) never has to fit in memory."""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

MAX_LINE = 16 * 1024 * 1024


class Lines:
    """Iterate `(line_number, line_or_None, start_offset)`; a line longer than `limit` is
    consumed in pieces and reported as None. `position` is the byte offset read so far."""

    def __init__(self, f: BinaryIO, limit: int = MAX_LINE):
        self._f = f
        self._limit = limit
        self.position = 0

    def __iter__(self) -> Iterator[tuple[int, bytes | None, int]]:
        number = 0
        while True:
            start = self.position
            line = self._f.readline(self._limit)
            if not line:
                return
            self.position += len(line)
            number += 1
            if line.endswith(b"\n") or len(line) < self._limit:
                yield number, line, start
                continue
            while line and not line.endswith(b"\n"):  # too long: skip to its end
                line = self._f.readline(self._limit)
                self.position += len(line)
            yield number, None, start
