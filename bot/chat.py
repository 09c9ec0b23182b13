"""The terminal front end: `ask`, `chat` and `resume` render committed state as it is
published (streamed partials, then the delivered answer)."""

import asyncio
import contextlib
import shutil
import sys
from datetime import UTC, datetime
from typing import TextIO

from bot.agent.events import Event
from bot.agent.inbox import submit_message
from bot.app import App
from store import TERMINAL, new_id

POLL = 0.05
RESUME_HORIZON = 60.0  # seconds: `resume` waits for retries due this soon


class Renderer:
    """Writes one conversation's stream so that it ends up showing each answer once.

    On a terminal, partials stream in; when a stream restarts (a retry, or a crash resumed)
    the fragment shown so far is erased before the new text starts. Anywhere else (a pipe,
    a file) partials cannot be taken back, so only final answers are written."""

    def __init__(self, out: TextIO, live: bool | None = None):
        self.out = out
        self.live = _is_terminal(out) if live is None else live
        self.shown = ""

    def show(self, event: Event) -> None:
        if event.kind == "retry":
            self._erase()
        elif event.kind == "partial" and self.live:
            text = event.data["text"]
            if not text.startswith(self.shown):
                self._erase()
            self.out.write(text[len(self.shown):])
            self.shown = text
        elif event.kind == "final":
            text = event.data["text"]
            if not text.startswith(self.shown):
                self._erase()
            self.out.write(text[len(self.shown):] + "\n")
            self.shown = ""
        self.out.flush()

    def _erase(self) -> None:
        """Take the shown fragment off the screen: to the start of its first line, then
        clear to the end of the screen."""
        if not self.shown:
            return
        width = max(1, shutil.get_terminal_size().columns)
        rows = sum(max(1, -(-len(line) // width)) for line in self.shown.split("\n"))
        self.out.write("\r" + (f"\x1b[{rows - 1}F" if rows > 1 else "") + "\x1b[J")
        self.shown = ""


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


async def wait_for_turn(app: App, turn_id: str, out: TextIO, conversation_id: int) -> dict:
    """Run until the turn ends, rendering its conversation; returns the turn's result."""
    queue = app.deps.events.subscribe(conversation_id)
    renderer = Renderer(out)
    finals = 0
    try:
        while True:
            while not queue.empty():
                event = queue.get_nowait()
                finals += event.kind == "final"
                renderer.show(event)
            task = await app.store.get_task(turn_id)
            if task.state in TERMINAL:
                break
            with contextlib.suppress(TimeoutError):
                event = await asyncio.wait_for(queue.get(), POLL)
                finals += event.kind == "final"
                renderer.show(event)
    finally:
        app.deps.events.unsubscribe(queue)
    result = task.result or {}
    if not finals and result.get("text"):  # answered earlier (same request id) or elsewhere
        out.write(result["text"] + "\n")
    if task.state != "done":
        out.write(f"[turn {task.state}: {task.error}]\n")
    out.flush()
    return result


async def say(app: App, session: str, text: str, out: TextIO,
              request_id: str | None = None) -> dict:
    """Submit one terminal message and render its turn until it ends."""
    accepted = await submit_message(
        app.store, channel="cli", external_ids=[f"request:{request_id or new_id()}"],
        conversation_key=session, text=text, author="you")
    app.runner.wake()
    return await wait_for_turn(app, accepted.turn_id, out, accepted.conversation.id)


@contextlib.asynccontextmanager
async def serving(app: App):
    """The runner works in the background while the terminal talks; then it drains."""
    job = asyncio.create_task(app.runner.run())
    try:
        yield
    finally:
        await app.runner.drain(app.config.runtime.drain_seconds)
        await job


async def ask(app: App, session: str, text: str, request_id: str | None,
              out: TextIO = sys.stdout) -> int:
    async with serving(app):
        await say(app, session, text, out, request_id)
    return 0


async def chat(app: App, session: str, out: TextIO = sys.stdout) -> int:
    out.write(f"steward chat — session {session}; an empty line or Ctrl-D ends it\n")
    async with serving(app):
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except EOFError:
                break
            if not line.strip():
                break
            await say(app, session, line, out)
    return 0


async def resume(app: App, out: TextIO = sys.stdout) -> int:
    """Finish what is ready or interrupted; answers for the terminal are printed with
    their session."""
    queue = app.deps.events.subscribe()
    # Retries a minute away are waited for; an outage's longer backoff is left to `run`.
    await app.runner.run(until_idle=True, horizon=RESUME_HORIZON)
    while not queue.empty():
        event = queue.get_nowait()
        if event.kind == "final":
            out.write(f"[{event.data['conversation_key']}] {event.data['text']}\n")
    counts = await app.store.count_tasks()
    out.write("tasks: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
              + "\n")
    due = await app.store.next_due()
    if due is not None:
        at = datetime.fromtimestamp(due, UTC).isoformat(timespec="seconds")
        out.write(f"the next retry is due at {at}: `steward run` (or resume then) takes it\n")
    out.flush()
    return 0
