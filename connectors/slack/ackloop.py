"""A thread with an event loop of its own, where Slack's requests are acknowledged.

The agent's loop is busy (store commits, streaming, LLM responses); an ack served there
would wait behind all of it. Here the HTTP server (or the Socket Mode client), bolt's
checks and the journal run on their own loop, so a burst of work never delays an ack; the
journaled event is handed to the agent's loop with `call_soon_threadsafe`, in arrival
order.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any


class AckLoop:
    def __init__(self, name: str = "slack-ack"):
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        ready.wait()

    async def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the ack loop and wait for it from the caller's loop."""
        assert self.loop is not None, "start() first"
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def post(self, callback, *args: Any) -> None:
        """Call `callback(*args)` on the ack loop soon (from any thread); dropped once the
        loop has stopped."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(callback, *args)
            except RuntimeError:  # closed in between
                pass

    async def stop(self) -> None:
        if self.loop is None or self._thread is None:
            return
        await self.call(_cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self._thread.join, 10)
        self.loop = None


async def _cancel_the_rest() -> None:
    current = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
