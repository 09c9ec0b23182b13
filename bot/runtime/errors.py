"""What a task's step may raise that the runner treats apart, and the kind of failure it
records with the error (`Task.failure`, migration 0011):

Exception
 +-- Outage            the service an effect needs is down: retried for `outage_attempts`
 |                     (so is the store's own outage: `store.is_unavailable`)
 |    +-- NotPerformed     ... and the outside world certainly saw nothing
 |    +-- Unavailable      ... and it cannot tell whether the effect happened
 +-- store.DocumentConflict  lost a race to another edit: "contention", retried as long
 +-- anything else     a "fault": retried `max_attempts` times, then dead-lettered

Kinds the runner records without an exception: "poison" (the process died each time it
ran the task), "interrupted" (an unsafe effect cut off mid-way), "fault" for a task's own
`Fail`. A phase that succeeds clears the kind.
"""

from store.errors import DocumentConflict
from store.outage import is_unavailable

OUTAGE, CONTENTION, FAULT, POISON, CUT_OFF = (
    "outage", "contention", "fault", "poison", "interrupted")


class Outage(Exception):
    """The service an effect needs is down (not the task's fault)."""


class NotPerformed(Outage):
    """Raised by an effect that knows the outside world saw nothing (its service is down,
    say): retried with backoff for up to `outage_attempts` tries, even when unsafe."""


class Unavailable(Outage):
    """Raised by an effect (or its `reconcile`) when the service it needs is down and it
    cannot tell whether the effect happened: retried with backoff for up to
    `outage_attempts` tries, and an unsafe effect is reconciled again first."""


def failure_kind(exc: BaseException) -> str:
    if isinstance(exc, Outage) or is_unavailable(exc):
        return OUTAGE
    if isinstance(exc, DocumentConflict):
        return CONTENTION
    return FAULT
