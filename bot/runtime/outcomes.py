"""What one phase of a task returns to the runner, which commits it with the phase's writes."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Continue:
    """Commit this checkpoint and run the next phase now."""

    phase: str
    checkpoint: Any = None


@dataclass(frozen=True)
class Wait:
    """Commit this checkpoint and sleep until the children settle: all of them (`all`) or
    the first failure (`fail_fast`)."""

    phase: str
    checkpoint: Any = None
    mode: str = "all"

    def __post_init__(self):
        if self.mode not in ("all", "fail_fast"):
            raise ValueError(f"wait mode must be 'all' or 'fail_fast', not {self.mode!r}")


@dataclass(frozen=True)
class Sleep:
    """Commit this checkpoint and run again after `seconds`, or sooner: when another task's
    commit wakes it (`Writes.wake`), or at once if one of `until_settled` has already
    settled by the time this commits (checked in the same transaction, so a wake sent
    while this phase was still running is not lost)."""

    seconds: float
    phase: str
    checkpoint: Any = None
    until_settled: tuple[str, ...] = ()


@dataclass(frozen=True)
class Done:
    result: Any = None
    inputs: Any = None  # replaces the task's inputs when not None (see Effect.settled_inputs)


@dataclass(frozen=True)
class Fail:
    error: str
    result: Any = None


@dataclass(frozen=True)
class Interrupted:
    """An unsafe effect was cut off and cannot be checked: never re-run, reported as is."""

    result: Any = None


Outcome = Continue | Wait | Sleep | Done | Fail | Interrupted
