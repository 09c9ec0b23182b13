"""Whether the process holding a task's lease lives. A lease holder is named `host:pid:id`
(bot/runtime/runner.py `Runner.owner`), so a reader on the same machine tells a holder
that is gone (killed, or stopped twice with Ctrl-C) before its lease runs out. Light on
purpose: `steward tasks` and the inspector ask it without loading the runtime."""

from __future__ import annotations

import os
import socket


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
