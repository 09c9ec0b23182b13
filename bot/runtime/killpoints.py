"""Injected crash points for the durability tests.

`STEWARD_KILL_AT=POINT` (or `POINT:KIND`) makes the process SIGKILL itself the first time
it reaches that point (for a task of that kind). Points in the runtime: `after-intent`
(the effect's start is committed), `in-phase` with `KIND.PHASE` (a phase is about to
run: every life that reaches it dies, a poison), `after-effect` (the effect returned,
its result is not committed yet), `after-result` (the result is committed), `after-phase` with
`KIND.PHASE` (a workflow phase was committed, e.g. `after-phase:turn.after_tools`);
effects may add their own, such as `in-effect`. Unset in production, where this is one dict lookup.
"""

import os
import signal

_TARGET = os.environ.get("STEWARD_KILL_AT", "")


def kill_point(point: str, kind: str = "") -> None:
    if not _TARGET:
        return
    if _TARGET == point or (kind and _TARGET == f"{point}:{kind}"):
        os.kill(os.getpid(), signal.SIGKILL)
