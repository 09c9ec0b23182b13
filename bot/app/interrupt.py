"""Ctrl-C in the terminal commands that run the agent (`chat`, `ask`): the first press asks
to stop once the answer in progress is finished, and the command says so; the second stops
now, and what it cut off is handed back to resume at the next start (`Runner.drain` with
`hand_back`), so no task is left shown as running with no process behind it.

The presses are events the command waits on beside its work (`unless`), not an exception
thrown into whatever line runs (asyncio's own handling cancels the main task on the first
press and raises KeyboardInterrupt anywhere on the second)."""

import asyncio
import contextlib
import signal
from collections.abc import Awaitable
from typing import Any


class CtrlC:
    def __init__(self):
        self.first = asyncio.Event()
        self.second = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def pressed(self) -> bool:
        return self.first.is_set()

    def __enter__(self) -> "CtrlC":
        loop = asyncio.get_running_loop()
        # A shell that starts us in the background without job control has SIGINT ignored:
        # left that way (Ctrl-C is not ours to hear then).
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            try:
                loop.add_signal_handler(signal.SIGINT, self._press)
                self._loop = loop
            except (RuntimeError, ValueError, NotImplementedError):  # not the main thread
                pass
        return self

    def __exit__(self, *exc) -> None:
        if self._loop is not None:
            self._loop.remove_signal_handler(signal.SIGINT)  # Python's own handler again
            self._loop = None

    def _press(self) -> None:
        (self.second if self.first.is_set() else self.first).set()


async def unless(event: asyncio.Event, work: Awaitable) -> tuple[bool, Any]:
    """(True, its result) when `work` finishes first; (False, None) when `event` is set
    first, `work` then cancelled (shield it to keep it going)."""
    job = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait([job, waiter], return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        job.cancel()
        raise
    finally:
        waiter.cancel()
    if job.done():
        return True, job.result()
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await job
    return False, None
