"""Store errors.

StoreError
 +-- LeaseLost          a phase commit found the task no longer leased to this worker
 +-- CorruptRow         a stored value could not be decoded; carries table and id
 +-- DocumentError      a document could not be read or written
 |    +-- DocumentCorrupt   an op in the stored history no longer applies
 |    +-- DocumentConflict  an edit was made against a version that is no longer the newest
 |    +-- OpError           an op that does not apply to its value (documents/ops.py)
 |    +-- StaleError        a tracked part of a draft used after it left it (documents/draft.py)
 +-- NotFound           a conversation, task or document that does not exist
 +-- NewerSchema        the database was migrated by a newer Steward than this one
 +-- SnapshotFailed     no snapshot before a migration, so no migration (store/snapshot.py)
 +-- LostCommits        the database is older than its home last saw (store/wal_guard.py)
"""


class StoreError(Exception):
    pass


class NoSchema(StoreError):
    """A database without Steward's tables, opened by a command that must not create them
    (one that only reads): its message says which database, in a person's words."""


class LeaseLost(StoreError):
    def __init__(self, task_id: str, owner: str):
        super().__init__(f"task {task_id} is no longer leased to {owner}")
        self.task_id = task_id
        self.owner = owner


class CorruptRow(StoreError):
    def __init__(self, table: str, row_id, column: str, reason: str):
        super().__init__(f"corrupt {table} row {row_id} ({column}): {reason}")
        self.table = table
        self.row_id = row_id
        self.column = column
        self.reason = reason


class DocumentError(StoreError):
    pass


class DocumentCorrupt(DocumentError):
    pass


class DocumentConflict(DocumentError):
    """Optimistic concurrency: the edit's ops were made against version `expected` of the
    document, but another step has committed since (`found` is the newest version now).
    The whole step is refused; whoever made it reads the document again and redoes it (a
    task's phase does so as a failed attempt, retried by the runner)."""

    def __init__(self, namespace: str, name: str, expected: int, found: int):
        super().__init__(f"document {name!r} in {namespace!r} moved on while it was being "
                         f"edited: the edit was made against version {expected}, the newest "
                         f"is {found}; read it again and redo the edit")
        self.namespace = namespace
        self.name = name
        self.expected = expected
        self.found = found


class NotFound(StoreError):
    pass


class NewerSchema(StoreError):
    """The database's schema revision is unknown to this build: a newer Steward wrote it.
    It is refused, never downgraded."""


class SnapshotFailed(StoreError):
    """No snapshot of the database could be taken before a migration, so it was not
    migrated (nothing changed)."""


class LostCommits(StoreError):
    """The database lacks commits that its home saw land (a deleted -wal after a crash).
    `loss` says how far behind it is."""

    def __init__(self, message: str, loss):
        super().__init__(message)
        self.loss = loss
