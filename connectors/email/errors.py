"""What goes wrong with mail, in one tree (each raised where its docstring says):

EmailError
 +-- Unparsable      parse: a message that cannot be read well enough to be answered
 +-- ImapError       imap: the server said NO or BAD (`outage`: its own trouble, now)
 +-- MessageFailed   watcher: taking one message failed; reconnect and try it again
 +-- NotSent         smtp: certainly not sent (refused, or cut off before the final dot)
 +-- InDoubt         smtp: cut off after the final dot: the server may have it
"""

import re

# RFC 5530 response codes that say the server (its storage, a lock, a limit, a bug of its
# own) is in trouble now, rather than that the request or the message is bad.
OUTAGE_CODES = frozenset({"UNAVAILABLE", "INUSE", "LIMIT", "SERVERBUG"})
RESPONSE_CODE = re.compile(r"\b(?:NO|BAD) \[([A-Za-z0-9-]+)")


class EmailError(Exception):
    pass


class Unparsable(EmailError):
    """The message cannot be read well enough to be answered; `str()` is the reason."""


class ImapError(EmailError):
    """The server said NO or BAD. `code`: the response code of its answer (RFC 5530, e.g.
    "UNAVAILABLE"), if it gave one; read from the text when not given."""

    def __init__(self, text: str, code: str | None = None):
        super().__init__(text)
        if code is None and (found := RESPONSE_CODE.search(text)):
            code = found.group(1)
        self.code = code.upper() if code else None

    @property
    def outage(self) -> bool:
        """The server says it cannot do this now (storage down, in use, a limit, its own
        bug), which may be the whole mailbox's trouble rather than the message's."""
        return self.code in OUTAGE_CODES


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class MessageFailed(EmailError):
    """Taking one message failed; the watcher reconnects and tries it again."""

    def __init__(self, uid: int, attempts: int, cause: BaseException):
        super().__init__(f"message {uid} failed (attempt {attempts}): {describe(cause)}")
        self.uid, self.attempts, self.cause = uid, attempts, cause


class NotSent(EmailError):
    """Certainly not sent: nothing was accepted, the connection was gone before the final
    dot, or the server refused the data."""


class InDoubt(EmailError):
    """The connection died after the final dot, before the answer: the server may have the
    message."""
