"""Who holds a task's lease: `host:pid:id`, one per runner (bot/runtime/runner.py), so that
a reader on the same machine can tell a holder that is gone (killed, or stopped twice with
Ctrl-C) before its lease runs out."""

from __future__ import annotations

import os
import socket

from store import new_id


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{new_id()}"


def holder_alive(owner: str) -> bool | None:
    """Whether the process named in a lease lives: False when it is of this machine and
    gone, None when that cannot be told (another machine, another user's process)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return None
    return True
