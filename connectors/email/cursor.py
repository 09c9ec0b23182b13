"""Where Steward is in a mailbox: the IMAP `(UIDVALIDITY, UID)` cursor, kept as a versioned
document (history `latest`, the port's `Position`) and moved in the same commit that
stores the message it passes.

`backlog` lists UIDs at or below `uid` that still have to be taken: the unread mail found
on the very first start, and after a UIDVALIDITY change the mail that may be new (the rest
is recognised by Message-ID). `at` is when the cursor last moved.
"""

import time
from dataclasses import dataclass, field, replace

from bot.port import AgentPort, Position


def namespace(address: str) -> str:
    return f"email:{address.strip().lower()}"


def document_name(mailbox: str) -> str:
    return f"imap-cursor:{mailbox}"


@dataclass(frozen=True)
class Cursor:
    uidvalidity: int
    uid: int
    backlog: tuple[int, ...] = field(default=())
    at: float = 0.0

    def past(self, uid: int) -> "Cursor":
        """The cursor once message `uid` is taken."""
        if uid in self.backlog:
            return replace(self, backlog=tuple(u for u in self.backlog if u != uid),
                           at=time.time())
        return replace(self, uid=max(self.uid, uid), at=time.time())

    def to_json(self) -> dict:
        return {"uidvalidity": self.uidvalidity, "uid": self.uid, "backlog": list(self.backlog),
                "at": self.at}

    @classmethod
    def from_json(cls, value: dict) -> "Cursor":
        return cls(int(value["uidvalidity"]), int(value["uid"]),
                   tuple(int(u) for u in value.get("backlog", [])), float(value.get("at", 0)))


async def load(port: AgentPort, address: str, mailbox: str) -> Cursor | None:
    value = await port.position(namespace(address), document_name(mailbox))
    return Cursor.from_json(value) if value else None


def position(address: str, mailbox: str, cursor: Cursor) -> Position:
    """The cursor as the port keeps it, moved with the message it passes."""
    return Position(namespace(address), document_name(mailbox), cursor.to_json())
