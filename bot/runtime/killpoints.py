"""Injected crash points for the durability tests.

`STEWARD_KILL_AT=POINT` (or `POINT:KIND`) makes the process SIGKILL itself the first time
it reaches that point (for a task of that kind). Points in the runtime: `after-intent`
(the effect's start is committed), `in-phase` with `KIND.PHASE` (a phase is about to
run: every life that reaches it dies, a poison), `after-effect` (the effect returned,
its result is not committed yet), `after-result` (the result is committed), `after-phase` with
`KIND.PHASE` (a workflow phase was committed, e.g. `after-phase:turn.after_tools`);
effects may add their own, such as `in-effect`. A suffix `#N` kills the N-th time instead
(`after-phase:turn.after_llm#2`: the second model request of a turn, committed with the
first round's tool results). Unset in production, where this is one dict lookup.
"""

import os
import signal

_TARGET, _, _nth = os.environ.get("STEWARD_KILL_AT", "").partition("#")
_NTH = int(_nth or 1)
_reached = 0


def kill_point(point: str, kind: str = "") -> None:
    global _reached
    if not _TARGET:
        return
    if _TARGET == point or (kind and _TARGET == f"{point}:{kind}"):
        _reached += 1
        if _reached >= _NTH:
            os.kill(os.getpid(), signal.SIGKILL)
