"""The progress display of `steward import`: one line on a terminal, redrawn in place at
most ten times a second (label, bar, share of the input done, counts and rate), always as
wide as the terminal at most, so it never wraps into a new line per update. Drawn with
`rich`, which is imported only when a bar is actually shown (the CLI starts faster without
it). On anything that is not a terminal it stays silent; the final summary line is always
written, after the bar has been taken off the screen."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


def _count(n: float) -> str:
    return f"{n:,.0f}"


def counts(*, read: int, added: int, bad: int, rate: float) -> str:
    return f"{_count(read)} read, {_count(added)} new, {_count(bad)} bad, {_count(rate)}/s"


class Progress:
    def __init__(self, label: str, *, stream: TextIO | None = None,
                 interactive: bool | None = None, interval: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, width: int | None = None):
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self._tty = bool(isatty and isatty())
        self.interactive = self._tty if interactive is None else interactive
        self.interval = interval
        self.clock = clock
        self.width = width  # None: the terminal's, as it is at each redraw
        self.started = clock()
        self._last = float("-inf")
        self._bar = None  # the rich display, made at the first redraw
        self._task = None

    def update(self, *, read: int, added: int, bad: int, position: int,
               total: int | None) -> None:
        if not self.interactive:
            return
        t = self.clock()
        if t - self._last < self.interval:
            return
        self._last = t
        if self._bar is None:
            self._start()
        rate = read / max(t - self.started, 1e-9)
        self._bar.update(self._task, completed=min(position, total) if total else 0,
                         total=total or None,
                         counts=counts(read=read, added=added, bad=bad, rate=rate))
        self._bar.refresh()

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, TaskProgressColumn, TextColumn
        from rich.progress import Progress as RichProgress
        from rich.table import Column

        console = Console(file=self.stream, force_terminal=True, width=self.width,
                          color_system="auto" if self._tty else None, highlight=False)
        width = console.width
        self._bar = RichProgress(
            # the label gives way first, then the bar; the counts are kept whole longest
            TextColumn("{task.description}", markup=False, table_column=Column(
                no_wrap=True, overflow="ellipsis", max_width=max(10, width // 5))),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=5)),
            TaskProgressColumn(),
            TextColumn("{task.fields[counts]}", markup=False, table_column=Column(
                no_wrap=True, overflow="ellipsis")),
            console=console, auto_refresh=False, transient=True, expand=True,
            redirect_stdout=False, redirect_stderr=False)
        self._bar.start()
        self._task = self._bar.add_task(self.label, total=None, counts="")

    def close(self) -> None:
        """Take the bar off the screen (and give the cursor back); safe to repeat."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def finish(self, summary: str, details: list[str] = ()) -> None:
        """Clear the bar; write the details (problems), then the summary line."""
        self.close()
        for line in details:
            self.stream.write(line + "\n")
        self.stream.write(summary + "\n")
        self.stream.flush()
