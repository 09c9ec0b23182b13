"""Whether an error is the store's outage (the database or the disk under it is not there
now) rather than a fault of the data or the code: waited out and retried, never blamed on
the message, task or event that happened to be in hand.

Recognised wherever it sits in the chain (`__cause__`, `__context__`, SQLAlchemy's
`.orig`): a lost or refused connection, a server shutting down, starting up or out of
resources (SQLSTATE classes 08, 53, 57P, 58), a full or failing disk (SQLite's FULL,
IOERR, CANTOPEN, BUSY, READONLY; ENOSPC, EIO, EROFS, EDQUOT), a timeout. Read by the
standard library and the exceptions' own attributes only: no driver is imported here.

A plain socket or file error (a refused connection, a timeout, ENOSPC) says nothing of
whose it is: it counts only if it was raised inside the store or its drivers (a frame of
their modules in its traceback). A connector that meets its own server's reset, or a full
disk under its own journal, is not told that the store is away.
"""

import errno

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_OUTAGE = {5, 6, 7, 8, 10, 13, 14, 15}  # BUSY LOCKED NOMEM READONLY IOERR FULL
#                                                CANTOPEN PROTOCOL
_SQLITE_WORDS = ("database or disk is full", "disk i/o error", "unable to open database",
                 "database is locked", "readonly database")
_ERRNO_OUTAGE = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.ECONNREFUSED,
                 errno.ECONNRESET, errno.ECONNABORTED, errno.EPIPE, errno.ETIMEDOUT,
                 errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.ENOTCONN}
_SQLSTATE_OUTAGE = ("08", "53", "57P", "58")
# Client-side states of a driver whose connection went away under it (asyncpg's "another
# operation is in progress": a connection a server restart left in the middle of one).
_CLOSED_WORDS = ("connection is closed", "connection was closed", "underlying connection",
                 "the connection is lost", "connection has been released",
                 "another operation")
_DEPTH = 8
_STORE_MODULES = ("store", "asyncpg", "sqlalchemy", "aiosqlite", "sqlite3")


def is_unavailable(exc: BaseException) -> bool:
    """True if `exc` (or what caused it) says the store cannot be reached or written now."""
    for e in _chain(exc):
        says = _says_unavailable(e)
        if says is True or (says is None and _raised_in_store(e)):
            return True
    return False


def is_refused(exc: BaseException) -> bool:
    """The store's outage, and certainly nothing of the write landed: the database itself
    refused it (SQLite, whose one writer rolled it back; PostgreSQL out of disk or memory,
    SQLSTATE class 53). A write whose connection broke may have committed all the same."""
    return is_unavailable(exc) and any(
        isinstance(getattr(e, "sqlite_errorcode", None), int)
        or str(getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)).startswith("53")
        for e in _chain(exc))


def _chain(exc: BaseException):
    """`exc` and what caused it (`__cause__`, `__context__`, SQLAlchemy's `.orig`), each
    once, at most `_DEPTH` of them."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < _DEPTH:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (getattr(e, "orig", None), e.__cause__, e.__context__)
                    if isinstance(x, BaseException))


def _raised_in_store(e: BaseException) -> bool:
    tb = e.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.partition(".")[0] in _STORE_MODULES:
            return True
        tb = tb.tb_next
    return False


def _says_unavailable(e: BaseException) -> bool | None:
    """True: the store's outage; None: an outage of something, if the store raised it."""
    if isinstance(e, ConnectionError | TimeoutError):
        return None
    if isinstance(e, OSError) and e.errno in _ERRNO_OUTAGE:
        return None
    if getattr(e, "connection_invalidated", False):  # SQLAlchemy: the pool dropped it
        return True
    code = getattr(e, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _SQLITE_OUTAGE
    sqlstate = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
    if isinstance(sqlstate, str):
        return sqlstate.startswith(_SQLSTATE_OUTAGE)
    name = type(e).__name__
    text = str(e).lower()
    if name in ("OperationalError", "DatabaseError") and any(w in text for w in _SQLITE_WORDS):
        return True
    if name in ("InterfaceError", "InternalClientError") and any(w in text
                                                                 for w in _CLOSED_WORDS):
        return True
    return name in ("ConnectionDoesNotExistError", "ConnectionFailureError",
                    "AdminShutdownError", "CrashShutdownError", "CannotConnectNowError")

