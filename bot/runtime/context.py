"""`TaskContext`: what a task definition sees while one of its phases runs."""

from typing import Any

from store import RUNNING, Store, Task, TaskUpdate, Writes


class TaskContext:
    def __init__(self, store: Store, task: Task, *, owner: str, claim: str):
        self.store = store
        self.task = task
        self.owner = owner
        # Unique per lease: a phase checkpoint that carries another claim was left behind
        # by a worker that died.
        self.claim = claim
        self.phase: str = task.phase
        self.checkpoint: Any = task.checkpoint
        self.writes = Writes()

    @property
    def inputs(self) -> Any:
        return self.task.inputs

    @property
    def idem_key(self) -> str | None:
        """The idempotency key reserved when the task was created (keyed effects)."""
        return self.task.idem_key

    def spawn(self, kind: str, inputs: Any, **kwargs) -> str:
        """A child task, created in the same commit as this phase's outcome."""
        kwargs.setdefault("conversation_id", self.task.conversation_id)
        return self.writes.spawn(kind, inputs, parent_id=self.task.id, **kwargs)

    async def children(self) -> list[Task]:
        return await self.store.list_tasks(parent_id=self.task.id, limit=10_000)

    async def save_checkpoint(self, checkpoint: Any, writes: Writes | None = None) -> None:
        """Commit a new checkpoint now (with `writes`, if given), within the running phase
        (for example the partial output of a long effect), without ending the phase."""
        writes = writes or Writes()
        writes.update_task(TaskUpdate(self.task.id, self.owner, RUNNING, self.phase,
                                      checkpoint=checkpoint, progressed=False))
        await self.store.commit(writes)
        self.checkpoint = checkpoint
