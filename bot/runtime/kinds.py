"""Typed task kinds: what a kind's checkpoints look like, phase by phase, and in which version.

A checkpoint outlives the build that wrote it: a task committed by one release is resumed
by the next. So a kind declares, in one table read top to bottom (`KindSpec`):

- its phases, in the order they usually run, each with the type of the checkpoint it
  starts from (a `Checkpoint` model, or None for a phase that starts with none) and the
  code that runs it;
- its `version`: the checkpoint format this build writes and reads. Version 1 is the
  format of the last release without versions (7338092); a checkpoint carries its version
  under `VERSION_KEY` only from version 2 on, so version 1 stays byte for byte what that
  release wrote (and what the store's claim writes as an effect's intent: `{"claim": id}`);
- how a checkpoint of an older version becomes one of this version (`migrations[n]` takes
  a `(phase, checkpoint)` of version n to version n + 1).

Anything else is refused (`Refused`): a newer version, an older one with no way up, an
unknown phase, a field this build does not know or a missing one. The runner quarantines
a refused task (its definition's `refused`, bot/runtime/runner.py) instead of running
code over data it cannot read.
"""

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from bot.runtime.outcomes import Continue, Outcome, Sleep, Wait

VERSION_KEY = "_version"


class Refused(Exception):
    """A checkpoint this build cannot read: the task is quarantined, not run."""


class Checkpoint(BaseModel):
    """A phase's checkpoint: strict about its fields (a field this build does not know is
    refused, not dropped), stored as JSON without the fields left at their defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    def but(self, **changes: Any):
        """A copy with `changes` (checked, as a loaded one is)."""
        return type(self).model_validate({**self.model_dump(), **changes})


Migration = Callable[[str, Any], tuple[str, Any]]


@dataclass(frozen=True)
class Phase:
    """One phase of a kind: its name (the first phase is ""), the type of the checkpoint
    it starts from (None: it starts from none), and what runs it:
    `run(definition, ctx, checkpoint) -> Outcome` (None for a kind that runs its phases
    itself, as an effect does). `or_none`: it may also start from no checkpoint at all."""

    name: str
    checkpoint: type[Checkpoint] | None
    run: Callable[..., Awaitable[Outcome]] | None = None
    or_none: bool = False


@dataclass(frozen=True)
class KindSpec:
    name: str
    version: int
    phases: tuple[Phase, ...]
    migrations: Mapping[int, Migration] = field(default_factory=dict)

    def __post_init__(self):
        names = [p.name for p in self.phases]
        if len(set(names)) != len(names):
            raise ValueError(f"task kind {self.name!r} declares a phase twice")
        missing = [n for n in range(1, self.version) if n not in self.migrations]
        if missing:
            # Every older version is either migrated or refused on purpose: say which.
            raise ValueError(f"task kind {self.name!r}: no migration from version(s) "
                             f"{missing}; declare one that raises Refused to refuse them")

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise Refused(f"task kind {self.name!r} has no phase {name!r}")

    def read(self, phase: str, raw: Any) -> tuple[Phase, Checkpoint | None]:
        """The phase and its typed checkpoint, from what the store holds (any version this
        build can migrate)."""
        version = raw.get(VERSION_KEY, 1) if isinstance(raw, dict) else 1
        if not isinstance(version, int) or version < 1:
            raise Refused(f"{self.name} checkpoint has no valid version ({version!r})")
        if version > self.version:
            raise Refused(f"{self.name} checkpoint is version {version}, written by a newer "
                          f"build; this one reads up to version {self.version}")
        if isinstance(raw, dict):
            raw = {k: v for k, v in raw.items() if k != VERSION_KEY}
        for n in range(version, self.version):
            phase, raw = self.migrations[n](phase, raw)
        p = self.phase(phase)
        if p.checkpoint is None or (p.or_none and raw is None):
            if raw not in (None, {}):
                raise Refused(f"{self.name} phase {phase!r} starts from no checkpoint, "
                              f"found {sorted(raw) if isinstance(raw, dict) else raw!r}")
            return p, None
        if not isinstance(raw, dict):
            raise Refused(f"{self.name} phase {phase!r} needs a checkpoint, found {raw!r}")
        try:
            return p, p.checkpoint.model_validate(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                 for e in exc.errors()[:3])
            raise Refused(f"{self.name} phase {phase!r}: unreadable checkpoint "
                          f"({problems})") from None

    def upgraded(self, phase: str, raw: Any) -> tuple[str, Any]:
        """`(phase, checkpoint)` as this version stores it, checked: for kinds that work
        on the stored form themselves (effects)."""
        p, checkpoint = self.read(phase, raw)
        return p.name, self.write(checkpoint) if checkpoint is not None else raw

    def write(self, checkpoint: Any) -> Any:
        """What the store keeps of a checkpoint (other values pass through as they are)."""
        if not isinstance(checkpoint, Checkpoint):
            return checkpoint
        out = checkpoint.model_dump(mode="json", exclude_defaults=True)
        return {**out, VERSION_KEY: self.version} if self.version > 1 else out

    def written(self, outcome: Outcome) -> Outcome:
        """`outcome` with its checkpoint as the store keeps it."""
        if isinstance(outcome, Continue | Wait | Sleep) and \
                isinstance(outcome.checkpoint, Checkpoint):
            return replace(outcome, checkpoint=self.write(outcome.checkpoint))
        return outcome

    async def run(self, definition: Any, ctx: Any) -> Outcome:
        """Run the task's current phase from its typed checkpoint."""
        p, checkpoint = self.read(ctx.phase, ctx.checkpoint)
        if p.run is None:
            raise TypeError(f"task kind {self.name!r} phase {p.name!r} has no code to run")
        ctx.phase = p.name
        return self.written(await p.run(definition, ctx, checkpoint))
