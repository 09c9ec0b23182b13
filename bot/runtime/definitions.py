"""Task definitions: the code behind a task kind.

A `TaskDef` runs one phase per `step` call and returns an outcome; the runner commits the
outcome together with the writes the phase collected. Two shapes cover everything:

- a workflow (subclass `TaskDef`): phases over a checkpoint, spawning child tasks and
  waiting on them (an agent turn, a compaction);
- an `Effect`: one effect in the outside world wrapped in the sandwich
  intent -> effect -> result, replayed after a crash by its `Policy`.

A kind of this build declares its phases, their checkpoints' types and its version in
`spec` (bot/runtime/kinds.py); a checkpoint it cannot read is refused, and the task is
quarantined (`refused`). Kinds without a `spec` (tests', benchmarks') take their
checkpoints as they come.
"""

import enum
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from bot.runtime.context import TaskContext
from bot.runtime.errors import NotPerformed, Unavailable  # noqa: F401 (re-exported)
from bot.runtime.killpoints import kill_point
from bot.runtime.kinds import Checkpoint, KindSpec, Phase
from bot.runtime.outcomes import Continue, Done, Fail, Interrupted, Outcome


class Policy(enum.StrEnum):
    SAFE = "safe"  # repeat freely
    KEYED = "keyed"  # repeat with the idempotency key reserved at creation
    UNSAFE = "unsafe"  # never repeat blindly: reconcile, or report as interrupted


class TaskDef(ABC):
    kind: ClassVar[str]
    spec: ClassVar[KindSpec | None] = None

    @abstractmethod
    async def step(self, ctx: TaskContext) -> Outcome: ...

    async def poisoned(self, ctx: TaskContext, reason: str) -> Outcome:
        """How the task ends when running it keeps killing the process (the runner's
        quarantine): failed with the reason, unless the kind knows someone to tell."""
        return Fail(reason)

    async def refused(self, ctx: TaskContext, reason: str) -> Outcome:
        """How the task ends when this build cannot read its checkpoint (`spec` refused
        it, a newer build's, say): failed with the reason, unless the kind knows someone
        to tell. `ctx.checkpoint` is the stored one, unread."""
        return Fail(reason)


class EffectMark(Checkpoint):
    """An effect's checkpoint once its intent is committed (phase "effect")."""

    claim: str | None = None  # the lease that started it (store.writes.Claim writes it)
    not_performed: bool = False  # the last try said nothing happened
    partial: Any = None  # what a long effect had done when it was cut off


def effect_spec(kind: str, mark: type[EffectMark] = EffectMark, *,
                version: int = 1) -> KindSpec:
    """An effect kind's table: it starts from nothing (or a try that said nothing happened:
    `not_performed`), then runs its effect."""
    return KindSpec(kind, version, (Phase("", mark, or_none=True), Phase("effect", mark)))


class Effect(TaskDef):
    """One outside effect. Subclasses set `kind` and `policy` and implement `perform`;
    unsafe effects that can look at the outside world also implement `reconcile`."""

    policy: ClassVar[Policy] = Policy.UNSAFE

    @abstractmethod
    async def perform(self, ctx: TaskContext) -> Any:
        """Do the effect and return its result. Writes added to `ctx.writes` land with the
        result. Long effects may `ctx.save_checkpoint({"partial": ...})` as they go."""

    async def reconcile(self, ctx: TaskContext) -> tuple[bool, Any]:
        """After a crash mid-effect: (True, result) if the effect is found to have happened,
        (False, None) if it certainly did not. The default cannot tell."""
        raise NotImplementedError

    def policy_for(self, ctx: TaskContext) -> Policy:
        """The replay policy of this task (an effect kind may decide per task, as tool
        calls do from the tool's declaration)."""
        return self.policy

    def can_reconcile(self, ctx: TaskContext) -> bool:
        return type(self).reconcile is not Effect.reconcile

    def settled_inputs(self, ctx: TaskContext) -> Any:
        """The inputs to keep once the effect is done, or None to keep them whole. An effect
        whose inputs are large and only needed to repeat it (an LLM call's pinned request)
        slims them here, in the same commit as its result."""
        return None

    async def step(self, ctx: TaskContext) -> Outcome:
        if self.spec is not None:  # checked (and brought up to date) before it is trusted
            ctx.phase, ctx.checkpoint = self.spec.upgraded(ctx.phase, ctx.checkpoint)
        policy = self.policy_for(ctx)
        if ctx.phase != "effect":
            if policy is Policy.SAFE:
                # Repeating it is harmless, so it needs no intent commit of its own.
                kill_point("after-intent", self.kind)
                ctx.phase, ctx.checkpoint = "effect", {"claim": ctx.claim}
                return await self._perform(ctx, policy)
            # The intent: from here on, the effect may have happened.
            return Continue("effect", {"claim": ctx.claim})
        checkpoint = ctx.checkpoint if isinstance(ctx.checkpoint, dict) else {}
        started_here = checkpoint.get("claim") == ctx.claim
        if not started_here and checkpoint.get("not_performed"):
            checkpoint = {}  # the last try said nothing happened: simply try again
        elif not started_here and policy is Policy.UNSAFE:
            if not self.can_reconcile(ctx):
                return Interrupted({"interrupted": True, "partial": checkpoint.get("partial")})
            happened, result = await self.reconcile(ctx)
            if happened:
                return Done(result, self.settled_inputs(ctx))
        if not started_here:
            # Safe and keyed effects run again (keyed ones with the same key); a reconciled
            # unsafe one that did not happen runs for the first time. Mark this claim.
            await ctx.save_checkpoint({**checkpoint, "claim": ctx.claim})
        return await self._perform(ctx, policy)

    async def _perform(self, ctx: TaskContext, policy: Policy) -> Outcome:
        try:
            result = await self.perform(ctx)
        except (NotPerformed, Unavailable):
            raise
        except Exception as exc:
            if policy is Policy.UNSAFE:
                return Fail(f"{type(exc).__name__}: {exc}")
            raise
        kill_point("after-effect", self.kind)
        return Done(result, self.settled_inputs(ctx))


class Registry:
    def __init__(self, *defs: TaskDef):
        self._defs: dict[str, TaskDef] = {}
        for d in defs:
            self.register(d)

    def register(self, definition: TaskDef) -> None:
        kind = getattr(definition, "kind", None)
        if not kind:
            raise ValueError(f"{type(definition).__name__} has no kind")
        if kind in self._defs:
            raise ValueError(f"task kind {kind!r} registered twice")
        self._defs[kind] = definition

    def get(self, kind: str) -> TaskDef | None:
        return self._defs.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._defs)

    def intents_at_claim(self, *, reconciling: bool = False) -> tuple[str, ...]:
        """Effect kinds whose intent can ride on the claim (store.writes.Claim): those that
        need one whatever the task (an effect choosing its policy per task, as tool calls
        do, writes its intent itself once it knows); `reconciling`: only those that look
        before they leap after a crash, so an intent in doubt costs them a look, never a
        false report that the effect was cut off."""
        return tuple(sorted(
            kind for kind, d in self._defs.items()
            if isinstance(d, Effect) and type(d).policy_for is Effect.policy_for
            and d.policy is not Policy.SAFE
            and (not reconciling or type(d).reconcile is not Effect.reconcile)))
