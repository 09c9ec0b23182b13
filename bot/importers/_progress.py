"""A one-line progress bar on a terminal: count, share of the input done and rate, redrawn
at most ten times a second. On anything that is not a terminal it stays silent; the final
summary line is always written."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

WIDTH = 24


def _count(n: float) -> str:
    return f"{n:,.0f}"


class Progress:
    def __init__(self, label: str, *, stream: TextIO | None = None,
                 interactive: bool | None = None, interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        if interactive is None:
            isatty = getattr(self.stream, "isatty", None)
            interactive = bool(isatty and isatty())
        self.interactive = interactive
        self.interval = interval
        self.clock = clock
        self.started = clock()
        self._last = float("-inf")
        self._drawn = False

    def elapsed(self) -> float:
        return self.clock() - self.started

    def update(self, *, read: int, added: int, bad: int, position: int,
               total: int | None) -> None:
        if not self.interactive:
            return
        t = self.clock()
        if t - self._last < self.interval:
            return
        self._last = t
        elapsed = max(t - self.started, 1e-9)
        if total:
            share = min(position / total, 1.0)
            filled = int(share * WIDTH)
            bar = f"[{'#' * filled}{'.' * (WIDTH - filled)}] {share:4.0%} "
        else:
            bar = ""
        line = (f"{self.label} {bar}{_count(read)} read, {_count(added)} new, "
                f"{_count(bad)} bad, {_count(read / elapsed)}/s")
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self._drawn = True

    def finish(self, summary: str, details: list[str] = ()) -> None:
        """Clear the bar; write the details (problems), then the summary line."""
        if self._drawn:
            self.stream.write("\r\x1b[K")
        for line in details:
            self.stream.write(line + "\n")
        self.stream.write(summary + "\n")
        self.stream.flush()
