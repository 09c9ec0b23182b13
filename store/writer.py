"""SQLite's single writer: one thread owns the write connection, and the store's write
transactions run there, one thread hop there and one back.

Group commit: the jobs that queued up while one transaction was committing run together in
the next, each inside a SAVEPOINT of its own, so a failing job is rolled back alone (a job
that found nobody queued behind it is the whole transaction, and needs none); every caller
is answered only after the group's COMMIT. One fsync then carries many steps, and
nothing is acknowledged before it is durable (the connection runs `synchronous=FULL`).

With `marks` (store/wal_guard.py), a transaction at most once a second also raises the
database's commit mark before its COMMIT, and the home's note of it is written after.

A job is a plain function of a `Session`, called on the writer thread. Code written for an
async connection (`store/commit.py`) runs through `Session.inline`: its `execute` returns
at once, so the coroutine finishes in one step without an event loop.
"""

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.pool import StaticPool

from store.read.plain import InlineSqlite
from store.wal_guard import Marks

log = logging.getLogger(__name__)

MAX_GROUP = 256  # jobs per transaction: bounds how long the first of them waits
_STOP = object()


class InlineConnection:
    """The async connection interface `store/commit.py` uses, over a blocking SQLAlchemy
    connection: each `execute` is done by the time it is awaited."""

    def __init__(self, conn):
        self._conn = conn
        self.dialect = conn.dialect

    async def execute(self, statement, parameters=None):
        return self._conn.execute(statement, parameters)

    async def exec_driver_sql(self, statement, parameters=None):
        return self._conn.exec_driver_sql(statement, parameters)


def run_inline(coro: Coroutine) -> Any:
    """Finish a coroutine that never suspends, here and now."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a store job awaited something other than its connection")


class Session:
    """What a job sees: the raw connection, and Core statements run over it."""

    def __init__(self, raw: sqlite3.Connection):
        self.raw = raw
        # A blocking engine over this very connection, so Core statements join the
        # writer's transaction. Transactions are the writer's own (BEGIN/SAVEPOINT/COMMIT
        # below): this connection is never committed, rolled back or closed but at the end.
        engine = create_engine("sqlite://", creator=lambda: raw, poolclass=StaticPool)
        self._engine = engine
        self._sa = engine.connect()
        self.conn = InlineConnection(self._sa)
        self.text = InlineSqlite(raw)  # text SQL straight on the driver (store/read/queries.py)

    def inline(self, fn: Callable[[InlineConnection], Coroutine]) -> Any:
        return run_inline(fn(self.conn))

    def close(self) -> None:
        self._sa.close()  # between transactions: its reset's ROLLBACK finds nothing open
        self._engine.dispose()


class SqliteWriter:
    def __init__(self, connect: Callable[[], sqlite3.Connection], *, marks: Marks | None = None):
        self._connect = connect  # opens and configures the connection (on the thread)
        self._marks = marks
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.transactions = 0  # committed so far (the tests count groups with it)

    async def run(self, job: Callable[[Session], Any]) -> Any:
        """Run `job` in a write transaction; return (or raise) what it did, once that
        transaction has committed."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._thread is None:
            self._ensure_started()
        self._queue.put((job, loop, future))
        return await future

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="steward-sqlite-writer",
                                                daemon=True)
                self._thread.start()

    async def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(_STOP)
            await asyncio.to_thread(thread.join)

    # -- on the writer thread --------------------------------------------------------------

    def _serve(self) -> None:
        try:
            raw = self._connect()
            session = Session(raw)
        except Exception as exc:  # every write fails with the reason, none hangs
            log.error("cannot open the SQLite writer: %s", exc)
            while (job := self._queue.get()) is not _STOP:
                self._answer([(job, None, exc)])
            return
        try:
            while (jobs := self._next_group()) is not None:
                try:
                    answers = self._transaction(raw, session, jobs)
                except Exception as exc:  # BEGIN or COMMIT failed: nothing of it landed
                    _roll_back(raw)
                    answers = [(None, exc)] * len(jobs)
                self._answer([(job, *a) for job, a in zip(jobs, answers, strict=True)])
        finally:
            session.close()
            raw.close()

    def _next_group(self) -> list | None:
        """The next job, and whatever queued up behind it; None once closed."""
        first = self._queue.get()
        if first is _STOP:
            return None
        jobs = [first]
        q = self._queue
        while len(jobs) < MAX_GROUP and not q.empty():  # one consumer: not empty, not Empty
            job = q.get_nowait()
            if job is _STOP:
                self._queue.put(_STOP)  # after this group
                break
            jobs.append(job)
        return jobs

    def _transaction(self, raw: sqlite3.Connection, session: Session, jobs: list) -> list:
        if len(jobs) == 1:
            return [self._alone(raw, session, jobs[0][0])]
        answers: list[tuple[Any, BaseException | None]] = []
        landed: list[int] = []  # jobs whose writes wait for the COMMIT
        raw.execute("BEGIN IMMEDIATE")
        for i, (fn, _, _) in enumerate(jobs):
            raw.execute("SAVEPOINT job")
            try:
                answers.append((fn(session), None))
            except Exception as exc:
                answers.append((None, exc))
                if raw.in_transaction:
                    raw.execute("ROLLBACK TO job")
                    raw.execute("RELEASE job")
                    continue
                # SQLite rolled the whole transaction back (a full disk, an I/O error): the
                # jobs before this one are undone too, and are told so.
                for j in landed:
                    answers[j] = (None, exc)
                landed.clear()
                raw.execute("BEGIN IMMEDIATE")
                continue
            raw.execute("RELEASE job")
            landed.append(i)
        self._commit(raw)
        return answers

    def _alone(self, raw: sqlite3.Connection, session: Session, fn) -> tuple:
        """A group of one: the job's failure rolls back the transaction, which holds nothing
        else, so it needs no SAVEPOINT (two statements fewer per commit)."""
        raw.execute("BEGIN IMMEDIATE")
        try:
            value = fn(session)
        except Exception as exc:
            if raw.in_transaction:  # else SQLite rolled it back itself
                raw.execute("ROLLBACK")
            return None, exc
        self._commit(raw)
        return value, None

    def _commit(self, raw: sqlite3.Connection) -> None:
        mark = self._marks.stamp(raw) if self._marks is not None else None
        raw.execute("COMMIT")
        self.transactions += 1
        if mark is not None:
            self._marks.stamped(mark)

    @staticmethod
    def _answer(answers) -> None:
        for (_, loop, future), value, exc in answers:
            try:
                loop.call_soon_threadsafe(settle, future, value, exc)
            except RuntimeError:  # that caller's event loop is gone
                log.debug("write answered after its event loop closed")


def _roll_back(raw: sqlite3.Connection) -> None:
    """End what a failed BEGIN or COMMIT left open. A ROLLBACK that fails as well (the disk
    failing under it) must not end the writer thread, or every later write would wait for
    ever: SQLite rolls back at the next statement whatever happens."""
    try:
        if raw.in_transaction:
            raw.execute("ROLLBACK")
    except sqlite3.Error as exc:
        log.warning("SQLite writer: ROLLBACK failed: %s", exc)


def settle(future: asyncio.Future, value: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
