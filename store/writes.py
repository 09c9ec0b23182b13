"""`Writes`: everything one step of work wants to make durable, committed as one unit.

A step (an inbound message being accepted, a task phase finishing, a delivery being
recorded) collects its writes here and hands them to `Store.commit`, which applies all of
them in one transaction or none. Nothing here touches the database.
"""

from dataclasses import dataclass, field
from typing import Any

from store.records import UsageRecord, dumps, new_id

HISTORY_POLICIES = ("latest", "rewindable")
FORK_POLICIES = ("initial", "current", "as_of")


@dataclass
class NewEntry:
    conversation_id: int
    kind: str
    text: str
    data: Any = None
    author: str | None = None
    ref: str | None = None
    task_id: str | None = None
    created_at: float | None = None  # when it was said (imports); default: now
    head: bool = False  # a head marker: the model's context starts here from now on


@dataclass
class NewTask:
    id: str
    kind: str
    inputs: Any
    parent_id: str | None = None
    conversation_id: int | None = None
    dedupe_key: str | None = None
    idem_key: str | None = None
    run_after: float = 0.0


@dataclass
class NewSubmission:
    channel: str
    external_ids: list[str]
    conversation_id: int | None = None
    payload: Any = None
    task_id: str | None = None
    quarantine_reason: str | None = None


@dataclass
class DocumentWrite:
    namespace: str
    name: str
    ops: list[dict]
    initial: Any
    history: str
    fork_policy: str
    conversation_id: int | None = None
    # The version the ops were made against: the commit refuses the whole step
    # (`DocumentConflict`) if the document has moved on since. None: apply to the newest.
    base_version: int | None = None


@dataclass
class TaskUpdate:
    """The new whole state of a leased task after a phase. The checkpoint replaces the old
    one; a task left `running` keeps its lease, any other state releases it."""

    task_id: str
    owner: str
    state: str
    phase: str
    checkpoint: Any = None
    result: Any = None
    error: str | None = None
    failure: str | None = None  # the error's kind (store.records.Task.failure)
    wait_mode: str | None = None
    run_after: float = 0.0
    attempts: int | None = None  # None leaves the count as it is
    # The phase ended (or failed) in this process: the deaths counted against the task are
    # forgotten. False for a checkpoint saved within a phase (a partial output).
    progressed: bool = True
    inputs: Any = None  # None leaves them as they are
    wake_if_settled: list[str] = field(default_factory=list)  # pending: due now if any is


@dataclass(frozen=True)
class Claim:
    """Lease up to `limit` ready tasks for `owner` (expired leases first, then due work).

    `intent_kinds`: effect kinds whose intent (their first commit: "from here on the
    effect may have happened") rides on the claim itself, so the unsafe sandwich costs the
    claim and the result, not three commits. A fresh task of such a kind (phase "", no
    checkpoint) is claimed straight into phase "effect" with the checkpoint
    `{"claim": claim_id}`. A suspect of killing the process (`ride_below` deaths or more,
    this one counted) is claimed as it is: it may be handed back untouched."""

    owner: str
    limit: int
    lease_seconds: float
    claim_id: str = ""
    intent_kinds: tuple[str, ...] = ()
    ride_below: int = 0

    @property
    def ride(self) -> str:
        """The checkpoint a riding intent writes, as stored."""
        return dumps({"claim": self.claim_id})


@dataclass
class ScheduleWrite:
    """Create or replace a schedule (all fields; `id` chosen by the caller)."""

    id: str
    name: str
    prompt: str
    trigger: dict
    timezone: str
    deliver: dict
    next_fire_at: float | None
    conversation_id: int | None = None
    owner: str | None = None
    catchup: str = "latest"
    state: str = "active"
    origin: str | None = None  # why its words are outside text; None: the person's own


@dataclass
class ScheduleAdvance:
    """An occurrence fired: move the schedule on, but only if it still expects
    `expected_next` (otherwise another worker fired it, and the whole step is dropped)."""

    id: str
    expected_next: float
    next_fire_at: float | None
    fired_at: float
    state: str = "active"


@dataclass
class TaskWithdrawal:
    """Finish a task that has not started, without running it: a compare-and-set from
    state `pending` in phase `phase` to `done` with `result` (terminal: never claimed,
    never resumed). `unstarted` are other tasks that must also still be pending in `phase`
    (they are left as they are). If any of it no longer holds, because a worker claimed one
    of them meanwhile, the whole step is dropped and the commit reports `duplicate`, like a
    submission seen before: the caller looks again."""

    task_id: str
    result: Any
    phase: str = ""
    unstarted: list[str] = field(default_factory=list)


@dataclass
class Writes:
    entries: list[NewEntry] = field(default_factory=list)
    tasks: list[NewTask] = field(default_factory=list)
    submissions: list[NewSubmission] = field(default_factory=list)
    documents: list[DocumentWrite] = field(default_factory=list)
    usage: list[UsageRecord] = field(default_factory=list)
    wakes: list[str] = field(default_factory=list)
    schedules: list[ScheduleWrite | ScheduleAdvance] = field(default_factory=list)
    task_update: TaskUpdate | None = None
    withdrawals: list[TaskWithdrawal] = field(default_factory=list)

    def append(self, conversation_id: int, kind: str, text: str = "", *, data: Any = None,
               author: str | None = None, ref: str | None = None,
               task_id: str | None = None, created_at: float | None = None,
               head: bool = False) -> None:
        self.entries.append(NewEntry(conversation_id, kind, text, data, author, ref, task_id,
                                     created_at, head))

    def spawn(self, kind: str, inputs: Any, *, parent_id: str | None = None,
              conversation_id: int | None = None, dedupe_key: str | None = None,
              idem_key: str | None = None, run_after: float = 0.0) -> str:
        """Create a task; its id is known now. A `dedupe_key` that already exists makes
        this spawn a no-op (the existing task's id is reported in the commit result)."""
        task_id = new_id()
        self.tasks.append(NewTask(task_id, kind, inputs, parent_id, conversation_id,
                                  dedupe_key, idem_key, run_after))
        return task_id

    def deliver(self, kind: str, inputs: Any, *, key: str | None = None,
                parent_id: str | None = None, conversation_id: int | None = None) -> str:
        """An outbound delivery: a task whose idempotency key is reserved now, before the
        send, so a retry after a crash reuses it (and can look for its own message)."""
        key = key or new_id()
        return self.spawn(kind, inputs, parent_id=parent_id, conversation_id=conversation_id,
                          dedupe_key=f"delivery:{key}", idem_key=key)

    def submit(self, channel: str, *external_ids: str, conversation_id: int | None = None,
               payload: Any = None, task_id: str | None = None) -> None:
        """An inbound submission. If any of its external ids was ever seen on this channel,
        the whole commit is a no-op and reports `duplicate`."""
        if not external_ids:
            raise ValueError("a submission needs at least one external id")
        self.submissions.append(NewSubmission(channel, list(external_ids), conversation_id,
                                              payload, task_id))

    def quarantine(self, channel: str, external_id: str, reason: str, payload: Any = None):
        """Record an inbound item that cannot be processed, with the reason; it is deduped
        like any submission so it is never retried forever."""
        self.submissions.append(NewSubmission(channel, [external_id], payload=payload,
                                              quarantine_reason=reason))

    def edit_document(self, namespace: str, name: str, ops: list[dict], *, initial: Any = None,
                      history: str = "rewindable", fork_policy: str = "as_of",
                      conversation_id: int | None = None,
                      base_version: int | None = None) -> None:
        """Edit a document with `ops`. With `base_version` (the version read, 0 for a
        document that does not exist yet) the edit is optimistic: if another step changed
        the document since, the commit raises `DocumentConflict` and writes nothing; read
        again and redo the edit. Ops that address list items by position need it: a
        position is only meaningful in the version it was read from."""
        if history not in HISTORY_POLICIES:
            raise ValueError(f"history must be one of {HISTORY_POLICIES}, not {history!r}")
        if fork_policy not in FORK_POLICIES:
            raise ValueError(f"fork_policy must be one of {FORK_POLICIES}, not {fork_policy!r}")
        self.documents.append(DocumentWrite(namespace, name, list(ops),
                                            {} if initial is None else initial, history,
                                            fork_policy, conversation_id, base_version))

    def record_usage(self, record: UsageRecord) -> None:
        self.usage.append(record)

    def save_schedule(self, schedule: ScheduleWrite) -> None:
        self.schedules.append(schedule)

    def advance_schedule(self, advance: ScheduleAdvance) -> None:
        self.schedules.append(advance)

    def wake(self, task_id: str) -> None:
        """Make a pending task due now (one that sleeps until something happens)."""
        self.wakes.append(task_id)

    def update_task(self, update: TaskUpdate) -> None:
        self.task_update = update

    def withdraw(self, task_id: str, result: Any, *, phase: str = "",
                 unstarted: list[str] | None = None) -> None:
        """Finish a task that is still pending in `phase` as done with `result`, without
        running it; the step is dropped if it (or any of `unstarted`) was claimed since
        (see `TaskWithdrawal`). A parent waiting for it is woken like for any child."""
        self.withdrawals.append(TaskWithdrawal(task_id, result, phase, list(unstarted or ())))

    def __bool__(self) -> bool:
        return bool(self.entries or self.tasks or self.submissions or self.documents
                    or self.usage or self.wakes or self.schedules or self.task_update
                    or self.withdrawals)
