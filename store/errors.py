"""Store errors.

StoreError
 +-- LeaseLost          a phase commit found the task no longer leased to this worker
 +-- CorruptRow         a stored value could not be decoded; carries table and id
 +-- DocumentError      a document could not be read or written
 |    +-- DocumentCorrupt   an op in the stored history no longer applies
 +-- NotFound           a conversation, task or document that does not exist
"""


class StoreError(Exception):
    pass


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


class NotFound(StoreError):
    pass
