"""The durable task runtime: definitions, outcomes, the runner."""

from bot.runtime.context import TaskContext
from bot.runtime.definitions import (
    Effect,
    NotPerformed,
    Policy,
    Registry,
    TaskDef,
    Unavailable,
)
from bot.runtime.outcomes import Continue, Done, Fail, Interrupted, Outcome, Sleep, Wait
from bot.runtime.runner import Runner, RunnerOptions

__all__ = [
    "Continue", "Done", "Effect", "Fail", "Interrupted", "NotPerformed", "Outcome", "Policy",
    "Registry", "Runner", "RunnerOptions", "Sleep", "TaskContext", "TaskDef", "Unavailable", "Wait",
]
