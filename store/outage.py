"""Whether an error is the store's outage (the database or the disk under it is not there
now) rather than a fault of the data or the code: waited out and retried, never blamed on
the message, task or event that happened to be in hand.

Recognised wherever it sits in the chain (`__cause__`, `__context__`, SQLAlchemy's
`.orig`): a lost or refused connection, a server shutting down, starting up or out of
resources (SQLSTATE classes 08, 53, 57P, 58), a full or failing disk (SQLite's FULL,
IOERR, CANTOPEN, BUSY, READONLY; ENOSPC, EIO, EROFS, EDQUOT), a timeout. Read by the
standard library and the exceptions' own attributes only: no driver is imported here.
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
# Client-side states of a driver whose connection went away under it.
_CLOSED_WORDS = ("connection is closed", "connection was closed", "underlying connection",
                 "the connection is lost", "connection has been released")
_DEPTH = 8


def is_unavailable(exc: BaseException) -> bool:
    """True if `exc` (or what caused it) says the store cannot be reached or written now."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < _DEPTH:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if _says_unavailable(e):
            return True
        todo.extend(x for x in (getattr(e, "orig", None), e.__cause__, e.__context__)
                    if isinstance(x, BaseException))
    return False


def _says_unavailable(e: BaseException) -> bool:
    if isinstance(e, ConnectionError | TimeoutError):
        return True
    if isinstance(e, OSError) and e.errno in _ERRNO_OUTAGE:
        return True
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
