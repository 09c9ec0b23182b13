"""The inbound journal: an acknowledged event is on disk before Slack hears the ack.

Slack considers an acknowledged event delivered and never sends it again, while Steward
processes events after the ack (reading a thread's history or downloading a file must not
hold Slack waiting). The gap between the two is closed here: the raw event is appended to
`slack-inbox.jsonl` in the home directory and fsynced (appends that arrive together share
one fsync) before the ack goes out; when its processing has committed, a `done` line
follows. On start every event without a `done` is processed again. That is always safe:
the submission of a message is deduplicated forever by the store, so an event that had in
fact been stored is a no-op. When the file grows past `COMPACT_BYTES` it is rewritten with
only the pending events (atomically), so it stays small under steady traffic. The file is
private to its owner (0600), like everything in the home directory; opening the journal
rewrites it, which also tightens one an older version left 0644.

A write that fails (a full disk, an I/O error), also one that wrote only part of its lines,
is cut back to the last good byte before the error is raised: no torn line is left for the
next line to be glued to. The events of a failed write are not acknowledged (the caller
answers so that Slack sends them again, `connector.py`); the `done` lines of a failed write
go with the next one. Reading back, a line that does not parse is searched for a whole
record at its end (a line an older version glued to a torn one), so it is not lost either.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

COMPACT_BYTES = 256_000


class Journal:
    def __init__(self, path: Path, *, compact_bytes: int = COMPACT_BYTES):
        self.path = path
        self.compact_bytes = compact_bytes
        self._queue: list[tuple[str, asyncio.Future | None]] = []
        self._flusher: asyncio.Task | None = None
        self._pending: dict[str, str] = {}  # event id -> its journal line
        self._size = 0
        self._good: int | None = None  # the file's length after the last good write

    async def open(self) -> list[dict]:
        """Read what the last process left: the bodies of events never marked done."""
        bodies = await asyncio.to_thread(self._read_and_rewrite)
        self._pending = {b.get("event_id") or "": _line(b) for b in bodies}
        return bodies

    async def append(self, body: dict) -> None:
        """Durably record an event (returns once it is fsynced)."""
        line = _line(body)
        self._pending[body.get("event_id") or ""] = line
        future = asyncio.get_running_loop().create_future()
        self._queue.append((line, future))
        self._kick()
        await future

    def done(self, event_id: str) -> None:
        """The event's processing committed; it need not be replayed (written lazily)."""
        self._pending.pop(event_id, None)
        self._queue.append((json.dumps({"done": event_id}), None))
        self._kick()

    async def close(self) -> None:
        if self._queue:  # `done` lines a failed write left behind: one more try
            self._kick()
        while self._flusher is not None and not self._flusher.done():
            await self._flusher

    def _kick(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            lines = [line for line, _ in batch]
            compact = self._size > self.compact_bytes
            if compact:  # every line still needed is a pending event, batch ones included
                lines = list(self._pending.values())
            try:
                await asyncio.to_thread(self._write, lines, compact)
            except Exception as exc:  # noqa: BLE001 - each waiting append is told
                log.error("slack journal %s: %s", self.path, exc)
                for _, future in batch:
                    if future is not None and not future.done():
                        future.set_exception(exc)
                # The `done` lines go with the next write (lazily, as ever): now if appends
                # queued up meanwhile (each is answered), else with the next append or done.
                waiting = any(future is not None for _, future in self._queue)
                self._queue[:0] = [(line, None) for line, future in batch if future is None]
                if not waiting:
                    return
                continue
            for _, future in batch:
                if future is not None and not future.done():
                    future.set_result(None)

    # -- in a worker thread ----------------------------------------------------------

    def _write(self, lines: list[str], compact: bool) -> None:
        if compact:
            self._replace(lines)
            return
        data = "".join(line + "\n" for line in lines).encode()
        sync = any(line.startswith('{"event"') for line in lines)
        fd = _private(str(self.path), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            end = os.fstat(fd).st_size
            if self._good is not None and end != self._good:
                os.ftruncate(fd, self._good)  # what a failed write left, if cutting failed
                end = self._good
            try:
                _write_all(fd, data)
                if sync:
                    os.fsync(fd)
            except BaseException:
                _cut(fd, end, self.path)
                raise
            self._size = self._good = end + len(data)
        finally:
            os.close(fd)

    def _replace(self, lines: list[str]) -> None:
        tmp = self.path.with_suffix(".tmp")
        data = "".join(line + "\n" for line in lines).encode()
        try:
            fd = _private(str(tmp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)  # the journal itself is as it was
            raise
        self._size = self._good = len(data)

    def _read_and_rewrite(self) -> list[dict]:
        events: dict[str, dict] = {}
        if self.path.exists():
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        # A torn last line (its ack was never sent), or a whole record glued
                        # to a torn one by an older version: that record is kept.
                        record = _glued_record(line)
                    if not isinstance(record, dict):
                        continue  # nothing this journal writes: passed over like a torn line
                    event, done = record.get("event"), record.get("done")
                    if isinstance(event, dict):
                        events[str(event.get("event_id") or "")] = event
                    elif isinstance(done, str):
                        events.pop(done, None)
        self._replace([_line(b) for b in events.values()])
        return list(events.values())


def _private(path: str, flags: int) -> int:
    """Open as the owner's alone: created 0600, or tightened to 0600 if an older version
    left it readable by others."""
    fd = os.open(path, flags, 0o600)
    if os.fstat(fd).st_mode & 0o077:
        os.fchmod(fd, 0o600)
    return fd


def _line(body: dict) -> str:
    return json.dumps({"event": body})


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte (a short write is followed by another, which raises the error)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _cut(fd: int, length: int, path: Path) -> None:
    """Cut the file back to `length` after a failed write (shrinking needs no space)."""
    try:
        os.ftruncate(fd, length)
    except OSError as exc:  # the next write tries again before it appends
        log.error("slack journal %s: cannot cut a failed write back: %s", path, exc)


_RECORD_STARTS = ('{"event": ', '{"done": ')


def _glued_record(line: str) -> object:
    """The last whole record in a line that does not parse, or None."""
    starts = sorted((i for mark in _RECORD_STARTS for i in _find_all(line, mark) if i > 0),
                    reverse=True)
    for i in starts:
        try:
            return json.loads(line[i:])
        except ValueError:
            continue
    return None


def _find_all(text: str, mark: str) -> list[int]:
    found, i = [], text.find(mark)
    while i != -1:
        found.append(i)
        i = text.find(mark, i + 1)
    return found
