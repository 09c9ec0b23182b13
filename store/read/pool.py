"""SQLite's readers: a few threads, each owning a connection, and a read as one thread
hop there and one back.

Through SQLAlchemy's async engine a one-row read cost about 2 ms on a 2-core machine:
aiosqlite sends the checkout, BEGIN, the statement, the fetch and the ROLLBACK to its
thread one at a time, each a hop and a wake-up of the event loop. Here the whole read (a
function of a connection, written as for an async one) runs on a reader thread in a
deferred transaction, so every statement of it sees one snapshot (WAL: readers never wait
for the writer), and only its answer comes back.

Connections are opened as threads start, on demand, up to `max_threads`; a read never
writes (`query_only`).
"""

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from store.writer import Session, run_inline, settle

log = logging.getLogger(__name__)

_STOP = object()


class SqliteReaders:
    def __init__(self, connect: Callable[[], sqlite3.Connection], *, max_threads: int = 4):
        self._connect = connect  # opens and configures a connection (on its thread)
        self._max = max_threads
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a read
        self._closed = False

    async def run(self, fn: Callable[[Any], Coroutine], *, text: bool = False) -> Any:
        """`await fn(conn)` on a reader's connection, in one read transaction; `fn` awaits
        nothing but `conn.execute` (`store.writer.run_inline`). `conn` is an SQLAlchemy
        connection, or with `text` a `store.read.plain.TextConnection` on the driver."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((fn, text, loop, future))
        self._more_if_busy()
        return await future

    def _more_if_busy(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._idle > 0:
                self._idle -= 1  # that one takes this read
                return
            if len(self._threads) < self._max:
                thread = threading.Thread(target=self._serve, daemon=True,
                                          name=f"steward-sqlite-reader-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
            # else: every reader is busy; the read waits in the queue for the first free one

    async def close(self) -> None:
        with self._lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(_STOP)
        for thread in threads:
            await asyncio.to_thread(thread.join)

    # -- on a reader thread ----------------------------------------------------------------

    def _serve(self) -> None:
        try:
            raw = self._connect()
            session = Session(raw)
        except Exception as exc:  # this read fails with the reason; the next thread tries again
            log.error("cannot open an SQLite reader: %s", exc)
            with self._lock:
                self._threads.remove(threading.current_thread())
            self._fail_one(exc)
            return
        try:
            while True:
                job = self._queue.get()
                if job is _STOP:
                    return
                self._read(raw, session, job)
                with self._lock:
                    self._idle += 1
        finally:
            session.close()
            raw.close()

    @staticmethod
    def _read(raw: sqlite3.Connection, session: Session, job) -> None:
        fn, text, loop, future = job
        value, error = None, None
        try:
            raw.execute("BEGIN")
            try:
                value = run_inline(fn(session.text)) if text else session.inline(fn)
            finally:
                if raw.in_transaction:
                    raw.execute("COMMIT")  # a read: nothing to commit but its snapshot's end
        except Exception as exc:
            error = exc
        try:
            loop.call_soon_threadsafe(settle, future, value, error)
        except RuntimeError:  # that caller's event loop is gone
            log.debug("read answered after its event loop closed")

    def _fail_one(self, exc: Exception) -> None:
        try:
            job = self._queue.get_nowait()
        except queue.Empty:
            return
        if job is _STOP:
            self._queue.put(_STOP)
            return
        *_, loop, future = job
        try:
            loop.call_soon_threadsafe(settle, future, None, exc)
        except RuntimeError:
            pass
