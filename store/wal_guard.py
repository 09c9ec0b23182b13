"""Noticing an SQLite database that lost commits: a crash whose `-wal` was then deleted.

Committed transactions live in `steward.db-wal` until a checkpoint copies them into
`steward.db`. Deleting the `-wal` after a crash (people do, when "the database is
locked") silently takes them away, and SQLite cannot tell: the file it opens is a
consistent, older database. So the home keeps its own note of how far the database got:

- the database: a counter in the header's `user_version` (nothing else in Steward uses it),
  raised by the store's writer inside one of its transactions at most once a second
  (`Marks.stamp`, before that transaction's COMMIT: no extra transaction, no extra fsync);
- the home: `<db>.state`, a side file with the counter last committed, written after that
  COMMIT returned (`Marks.stamped`; replaced atomically, not fsynced: a power cut may lose
  the note, which can only make the check miss a loss, never see one that is not there).

At every open for writing (`store.open_store`, before any migration or write) the database
must be at least as far as the note says (`verify`); a database behind it lost commits,
and the open is refused with `LostCommits`, saying what to do: put the `-wal` back if it
still exists, or restore a backup, or go on knowingly (`accept`, which `steward run
--accept-data-loss` calls: the note is set back to the database, so later starts go on).
`steward doctor` reports it (`inspect`). What this notices is a loss of the commits made
before the newest note, i.e. up to a second before the crash; a loss of only the last
second's commits passes unseen.

A database whose side file is missing (a new home, a restore into one) has nothing to
compare with and opens; one restored over a newer database in the same home is reported
like any other loss until accepted.
"""

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from store.errors import LostCommits

log = logging.getLogger(__name__)

EVERY = 1.0  # seconds between two marks (the newest loss that can pass unseen)
ACCEPT = "steward run --accept-data-loss"


def state_path(db: Path) -> Path:
    return db.with_name(db.name + ".state")


@dataclass(frozen=True)
class Loss:
    db: Path
    has: int  # the database's mark now
    seen: int  # the mark the home saw committed
    at: float  # when it saw it (unix time)

    def detail(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))
        return (f"the database {self.db} is missing commits this home saw land: it is at "
                f"commit mark {self.has}, but was already at {self.seen} at {when} (its "
                f"{self.db.name}-wal was probably deleted after a crash)")

    def remedy(self) -> str:
        return (f"with Steward stopped, put {self.db.name}-wal back beside it if you still "
                f"have it, or restore a backup; to go on with the database as it is (those "
                f"commits are lost), start once with `{ACCEPT}`")

    def line(self) -> str:
        return f"{self.detail()}; {self.remedy()}"


class Marks:
    """The writer's side (store/writer.py): `stamp` inside a transaction, `stamped` once it
    has committed. Both on the writer thread."""

    def __init__(self, db: Path, every: float = EVERY):
        self.path = state_path(db)
        self._every = every
        self._due = 0.0  # monotonic time of the next mark: the first commit makes one

    def stamp(self, raw: sqlite3.Connection) -> int | None:
        if time.monotonic() < self._due:
            return None
        mark = raw.execute("PRAGMA user_version").fetchone()[0] + 1
        raw.execute(f"PRAGMA user_version = {int(mark)}")
        return mark

    def stamped(self, mark: int) -> None:
        self._due = time.monotonic() + self._every
        try:
            write_state(self.path, mark)
        except OSError as exc:  # a full disk: the note stays older, which only misses losses
            log.warning("cannot note the database's commit mark in %s: %s", self.path, exc)


def write_state(path: Path, mark: int, at: float | None = None) -> None:
    # A scratch name of this process's own: two processes writing at once each replace
    # the note whole.
    part = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"mark": mark, "at": time.time() if at is None else at}) + "\n")
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def read_state(path: Path) -> tuple[int, float] | None:
    """(mark, when) from a side file, or None: missing, or unreadable (a damaged side file
    is no reason to stop; it is written again at the next mark)."""
    try:
        data = json.loads(path.read_text())
        return int(data["mark"]), float(data.get("at") or 0.0)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable %s: %s", path, exc)
        return None


def database_mark(db: Path) -> int:
    """The database's mark (0 for a file that is empty or has none), read-only."""
    if not db.exists() or db.stat().st_size == 0:
        return 0
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])
    finally:
        conn.close()


def inspect(db: Path) -> Loss | None:
    """The loss, if the database is behind what its home saw (blocking: a thread)."""
    seen = read_state(state_path(db))  # first: a mark is noted only once committed
    if seen is None:
        return None
    has = database_mark(db)
    return Loss(db, has, *seen) if has < seen[0] else None


def verify(db: Path) -> None:
    """Raise `LostCommits` if the database is behind what its home saw."""
    loss = inspect(db)
    if loss is not None:
        raise LostCommits(loss.line(), loss)


def accept(db: Path) -> Loss | None:
    """Go on with the database as it is: the note is set back to its mark. The loss
    accepted, or None if there was none."""
    loss = inspect(db)
    if loss is not None:
        write_state(state_path(db), loss.has)
        log.info("accepted: %s", loss.detail())
    return loss
