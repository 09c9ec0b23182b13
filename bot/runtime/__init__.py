"""The durable task runtime: definitions, outcomes, the runner."""

from bot.runtime.context import TaskContext
from bot.runtime.definitions import (
    Effect,
    EffectMark,
    NotPerformed,
    Policy,
    Registry,
    TaskDef,
    Unavailable,
    effect_spec,
)
from bot.runtime.kinds import Checkpoint, KindSpec, Phase, Refused
from bot.runtime.outcomes import Continue, Done, Fail, Interrupted, Outcome, Sleep, Wait
from bot.runtime.runner import Runner, RunnerOptions

__all__ = [
    "Checkpoint", "Continue", "Done", "Effect", "EffectMark", "Fail", "Interrupted", "KindSpec",
    "NotPerformed", "Outcome", "Phase", "Policy", "Refused", "Registry", "Runner",
    "RunnerOptions", "Sleep", "TaskContext", "TaskDef", "Unavailable", "Wait", "effect_spec",
]
