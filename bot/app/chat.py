"""The terminal front end: `ask`, `chat` and `resume` render committed state as it is
published (streamed partials, then the delivered answer).

`chat` reads its lines on the event loop itself (the loop watches stdin), never in a thread
blocked in `input()`: Ctrl-C at the prompt then leaves at once, instead of when Enter is
next pressed (a thread cannot be interrupted, and the process would wait for it). On a
terminal the line is edited by the program, not the terminal's driver (line_editor.py, as
readline does), so that a reminder shown at the prompt goes above it and what was half
typed is drawn again after it, the cursor where it was. When the model gave no answer (its
provider unreachable, say) the answer shown is the apology the conversation keeps, and one
line on stderr says why; `ask` then exits 1.

Ctrl-C during an answer says what it does: the answer is finished and shown, unless Ctrl-C
comes again (bot/app/interrupt.py); what that cuts off is handed back, finished at the next
start and shown there (`chat` shows what reaches the terminal between its turns: `Aside`;
`resume` prints it with its session).
"""

import asyncio
import contextlib
import logging
import os
import shutil
import sys
from datetime import UTC, datetime
from typing import TextIO

from bot.agent.approval import ANSWERS
from bot.agent.approval import KIND as APPROVAL
from bot.agent.events import Event
from bot.agent.inbox import submit_message
from bot.app.interrupt import CtrlC, unless
from bot.app.line_editor import LineEditor, read_ready
from bot.app.wiring import App
from bot.channels import Outbound
from bot.redact import redact
from bot.runtime.supervision import describe
from bot.scheduler.loop import Scheduler
from store import DONE, TERMINAL, WAITING, new_id

log = logging.getLogger(__name__)

POLL = 0.05
QUIET_SECONDS = 0.5  # a drain this short is not announced
PROMPT = "you> "
STOPPING = "stopping: finishing the answer in progress… press Ctrl-C again to stop now"
STOPPED = ("stopped: what was in progress resumes at the next start (`steward chat`, `resume` "
           "or `run`), and its answer is shown then")
RESUME_HORIZON = 60.0  # seconds: `resume` waits for retries due this soon
READ_SIZE = 65536


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
        written = event.data.get("written")
        if written is not None and not written.done():  # the delivery may go on now
            written.set_result(None)

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
            if task.state in TERMINAL or (task.state == WAITING
                                          and await _asked_for_approval(app, turn_id)):
                while not queue.empty():  # what was published while we looked
                    event = queue.get_nowait()
                    finals += event.kind == "final"
                    renderer.show(event)
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
    if task.state == WAITING:
        out.write("[waiting for your approval: answer with the code above]\n")
    elif task.state != "done":
        out.write(f"[turn {task.state}: {task.error}]\n")
    out.flush()
    return result


async def _asked_for_approval(app: App, turn_id: str) -> bool:
    """The turn waits for the person: its approval request has been shown."""
    for approval in await app.store.list_tasks(parent_id=turn_id, kind=APPROVAL, active=True):
        if approval.phase == "waiting" and any(
                t.state == DONE for t in await app.store.list_tasks(parent_id=approval.id)) \
                and await app.store.submission_state(ANSWERS, approval.id) is None:
            return True
    return False


async def say(app: App, session: str, text: str, out: TextIO,
              request_id: str | None = None, turn_ids: list[str] | None = None) -> dict:
    """Submit one terminal message and render its turn until it ends (or waits for an
    approval). An answer to an approval ("yes 1a2b3c4d") renders the turn that waited.
    The turn's id is appended to `turn_ids` when given."""
    accepted = await submit_message(
        app.store, channel="cli", external_ids=[f"request:{request_id or new_id()}"],
        conversation_key=session, text=text, author="you")
    app.runner.wake()
    if turn_ids is not None:
        turn_ids.append(accepted.turn_id)
    if accepted.approval is not None:
        out.write(f"[{accepted.approval}]\n")
        turn = await app.store.get_task(accepted.turn_id)
        return await wait_for_turn(app, turn.id, out, turn.conversation_id)
    return await wait_for_turn(app, accepted.turn_id, out, accepted.conversation.id)


@contextlib.asynccontextmanager
async def serving(app: App, ctrl_c: CtrlC | None = None, err: TextIO = sys.stderr, *,
                  schedules: bool = False):
    """The runner works in the background while the terminal talks (and with `schedules`,
    the scheduler fires what comes due); then it drains, saying so when there is work to
    wait for (Ctrl-C again stops now)."""
    job = asyncio.create_task(app.runner.run())
    scheduler = Scheduler(app.deps) if schedules else None
    firing = asyncio.create_task(scheduler.run()) if scheduler is not None else None
    if firing is not None:
        firing.add_done_callback(_ended)
    try:
        yield
    finally:
        if scheduler is not None:
            scheduler.stop()
            await asyncio.gather(firing, return_exceptions=True)
        await _stop(app, ctrl_c, err)
        await job


def _ended(firing: asyncio.Task) -> None:
    """The scheduler stopped by itself (not an outage: those it waits out): the chat goes
    on, its reminders left to the next start or to `run`."""
    if not firing.cancelled() and firing.exception() is not None:
        log.error("schedules stopped firing in this chat: %s", describe(firing.exception()))


async def _stop(app: App, ctrl_c: CtrlC | None, err: TextIO) -> None:
    """Drain the runner. Work that takes longer than a moment is announced, and a
    (second) Ctrl-C stops it now, handing it back to resume at the next start."""
    runner, grace = app.runner, app.config.runtime.drain_seconds
    runner.stop()
    if ctrl_c is None:
        await runner.drain(grace)
        return
    if not ctrl_c.second.is_set():
        drained = asyncio.ensure_future(runner.drain(grace, hand_back=True))
        await asyncio.wait([drained], timeout=QUIET_SECONDS)  # most work ends at once
        if not drained.done():
            _say(err, f"stopping: finishing the work in progress ({runner.busy} task"
                      f"{'s' if runner.busy > 1 else ''})… press Ctrl-C again to stop now")
        finished, in_time = await unless(ctrl_c.second, asyncio.shield(drained))
        if finished:
            if not in_time:  # past [runtime] drain_seconds: handed back
                _say(err, STOPPED)
            return
        drained.cancel()
        await asyncio.gather(drained, return_exceptions=True)
    if runner.busy:
        await runner.drain(0, hand_back=True)
        _say(err, STOPPED)


def _say(err: TextIO, line: str) -> None:
    err.write(("\n" if _is_terminal(err) else "") + line + "\n")
    err.flush()


async def model_failure(app: App, turn_id: str) -> str | None:
    """Why the turn's model gave no answer (the error of its last LLM call), or None."""
    calls = await app.store.list_tasks(parent_id=turn_id, kind="llm_call", newest_first=True,
                                       limit=1)
    if not calls or calls[0].state not in TERMINAL:
        return None
    call = calls[0]
    if call.state == DONE:
        return (call.result or {}).get("error")
    return call.error or call.state


async def _turn(app: App, session: str, text: str, out: TextIO, err: TextIO,
                request_id: str | None = None) -> bool:
    """Say `text` and render the turn; False (with a line on `err`) when the model gave no
    answer or the turn did not finish."""
    turn_ids: list[str] = []
    await say(app, session, text, out, request_id, turn_ids=turn_ids)
    [turn_id] = turn_ids
    failure = await model_failure(app, turn_id)
    if failure is not None:
        where = getattr(app.deps.client, "base_url", None)
        err.write(f"steward: the model gave no answer: {redact(failure)}"
                  + (f" ({where})" if where else "") + "\n")
        err.flush()
        return False
    return (await app.store.get_task(turn_id)).state in (DONE, WAITING)


async def _answer(app: App, session: str, text: str, out: TextIO, err: TextIO,
                  ctrl_c: CtrlC, request_id: str | None = None) -> bool | None:
    """`_turn`, through a Ctrl-C: the first lets the answer finish (and says so), the
    second stops rendering it (`serving` then hands it back). None when Ctrl-C was pressed,
    else whether the turn answered."""
    job = asyncio.ensure_future(_turn(app, session, text, out, err, request_id))
    finished, ok = await unless(ctrl_c.first, asyncio.shield(job))
    if finished:
        return ok
    _say(err, STOPPING)
    await unless(ctrl_c.second, job)
    return None


async def ask(app: App, session: str, text: str, request_id: str | None,
              out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    with CtrlC() as ctrl_c:
        async with serving(app, ctrl_c, err):
            ok = await _answer(app, session, text, out, err, ctrl_c, request_id)
    return 130 if ctrl_c.pressed else 0 if ok else 1


class StdinLines:
    """Lines from a file descriptor, read when the event loop says it is readable (a
    terminal or a pipe); a regular file, which is always readable and which the loop cannot
    watch, is read in a thread (a read from a file never waits for a person)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._buffer = b""
        self._eof = False

    async def readline(self) -> str | None:
        """The next line without its newline; None at the end of the input."""
        while b"\n" not in self._buffer and not self._eof:
            chunk = await self._read()
            self._eof = not chunk
            self._buffer += chunk
        if not self._buffer:
            return None
        line, newline, rest = self._buffer.partition(b"\n")
        self._buffer = rest if newline else b""
        return line.decode("utf-8", "replace").removesuffix("\r")

    async def _read(self) -> bytes:
        try:
            return await read_ready(self.fd, READ_SIZE)
        except (PermissionError, ValueError, NotImplementedError):
            return await asyncio.to_thread(os.read, self.fd, READ_SIZE)


class Aside:
    """What reaches the terminal with no turn of this chat rendering it (a reminder, an
    answer finished for a chat that was stopped): shown at the prompt (the prompt written
    again after it, with what the person had half typed and the cursor where it was, when
    a `LineEditor` reads the line), or once the turn on screen has ended, never inside its
    streamed text. Another session's message says which session it is."""

    def __init__(self, out: TextIO, session: str, editor: LineEditor | None = None):
        self.out = out
        self.session = session
        self.editor = editor
        self.live = _is_terminal(out)
        self.prompting = False  # the prompt is on screen, waiting for a line
        self.busy = False  # a turn is being rendered
        self.held: list[Outbound] = []

    def __call__(self, message: Outbound) -> None:
        self.held.append(message)
        if not self.busy:
            self.flush()

    def prompt(self) -> None:
        self.flush()
        if self.editor is not None:
            self.editor.show()
        else:
            self.out.write(PROMPT)
            self.out.flush()
        self.prompting = True

    def flush(self) -> None:
        if not self.held:
            return
        if self.editor is not None:
            prompting = self.editor.shown
            self.editor.hide()
        else:
            prompting = self.prompting
            if prompting:  # off the prompt's line (on a terminal, the prompt taken away)
                self.out.write("\r\x1b[K" if self.live else "\n")
        for message in self.held:
            key = message.conversation_key
            self.out.write((message.text if key == self.session else f"[{key}] {message.text}")
                           + "\n")
        self.held.clear()
        if prompting and self.editor is not None:
            self.editor.show()
        elif prompting:
            self.out.write(PROMPT)
        self.out.flush()


def _reader(out: TextIO) -> tuple[StdinLines | LineEditor, contextlib.AbstractContextManager]:
    """A person at a terminal types into a `LineEditor` (the terminal's modes changed
    within the context); anything else (a pipe, a file) is read a line at a time."""
    fd = sys.stdin.fileno()
    if os.isatty(fd) and _is_terminal(out):
        editor = LineEditor(fd, out, PROMPT)
        return editor, editor.editing()
    return StdinLines(fd), contextlib.nullcontext()


async def chat(app: App, session: str, out: TextIO = sys.stdout,
               err: TextIO = sys.stderr) -> int:
    """Talk until an empty line, the end of the input or Ctrl-C. Due schedules fire here
    too (an occurrence's commit is keyed: with `run` up as well, each still fires once),
    and what they deliver to the terminal is shown between turns (`Aside`)."""
    lines, editing = _reader(out)
    aside = Aside(out, session, lines if isinstance(lines, LineEditor) else None)
    app.deps.channels["cli"].aside = aside  # before the runner resumes anything
    out.write(f"steward chat — session {session}; an empty line, Ctrl-D or Ctrl-C ends it\n")
    with editing, CtrlC() as ctrl_c:
        async with serving(app, ctrl_c, err, schedules=True):
            while True:
                aside.prompt()
                read, line = await unless(ctrl_c.first, lines.readline())
                aside.prompting = False
                if not read:  # Ctrl-C at the prompt: off its line, then out
                    if aside.editor is not None:
                        aside.editor.finish()
                    else:
                        out.write("\n")
                        out.flush()
                    break
                if line is None or not line.strip():
                    break
                aside.busy = True
                try:
                    await _answer(app, session, line, out, err, ctrl_c)
                finally:
                    aside.busy = False
                    aside.flush()
                if ctrl_c.pressed:
                    break
    return 130 if ctrl_c.pressed else 0


async def resume(app: App, out: TextIO = sys.stdout) -> int:
    """Finish what is ready or interrupted; answers for the terminal are printed with
    their session."""
    def shown(message: Outbound) -> None:
        out.write(f"[{message.conversation_key}] {message.text}\n")
        out.flush()

    app.deps.channels["cli"].aside = shown
    # Retries a minute away are waited for; an outage's longer backoff is left to `run`.
    await app.runner.run(until_idle=True, horizon=RESUME_HORIZON)
    counts = await app.store.count_tasks()
    out.write("tasks: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")
              + "\n")
    due = await app.store.next_due()
    if due is not None:
        at = datetime.fromtimestamp(due, UTC).isoformat(timespec="seconds")
        out.write(f"the next retry is due at {at}: `steward run` (or resume then) takes it\n")
    out.flush()
    return 0
