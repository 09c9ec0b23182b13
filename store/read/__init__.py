"""Reading, in one home: every read the store makes that is not a step's own.

    plain.py         text SQL straight on a driver (`TextConnection`, `run`), what every
                     read below is written against
    queries.py       the reads themselves: conversations, entries, tasks, schedules,
                     submissions, spend (and the column lists search and export share)
    pool.py          SQLite's reader threads, one hop per read (`SqliteReaders`)
    asyncpg_text.py  the same connection shape on an asyncpg connection (PostgreSQL)
    reader.py        a reader without the store, for the reading commands (`sessions`,
                     `log` ...): only the records, the SQL and the standard library

This package imports nothing on its own: `steward sessions` pays only for what it uses.
"""
