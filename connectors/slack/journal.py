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
            except OSError as exc:
                log.error("slack journal %s: %s", self.path, exc)
                for _, future in batch:
                    if future is not None and not future.done():
                        future.set_exception(exc)
                continue
            for _, future in batch:
                if future is not None and not future.done():
                    future.set_result(None)

    # -- in a worker thread ----------------------------------------------------------

    def _write(self, lines: list[str], compact: bool) -> None:
        if compact:
            self._replace(lines)
            return
        with open(self.path, "a", encoding="utf-8", opener=_private) as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            if any(line.startswith('{"event"') for line in lines):
                os.fsync(f.fileno())
            self._size = f.tell()

    def _replace(self, lines: list[str]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8", opener=_private) as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
            self._size = f.tell()
        os.replace(tmp, self.path)

    def _read_and_rewrite(self) -> list[dict]:
        events: dict[str, dict] = {}
        if self.path.exists():
            with open(self.path, encoding="utf-8") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue  # a torn last line: its ack was never sent
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
