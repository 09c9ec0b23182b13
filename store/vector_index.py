"""SQLite's approximate index of entry embeddings: a usearch HNSW file beside the database.

PostgreSQL has pgvector in the server; SQLite here cannot load extensions (this Python's
sqlite3 has no `enable_load_extension`) and sqlite-vec would only be exact. So the index
of a model's vectors is a usearch file (int8, cosine) in `<database>-vectors/`, memory-
mapped (`view`: its pages are the kernel's cache, not this process's heap). The store stays
the source of truth:

- the file's name carries the `entry_vectors` rowid it covers up to, its size and the
  sha256 of its bytes (`<model>.<rowid>.<bytes>.<sha256, 32 hex>.usearch`; see "Damage"
  below); rowids only grow (SQLite has one writer, and a vector row is deleted only by
  `steward forget`, which then removes every file: `discard`), so the vectors stored since
  are exactly those with a larger rowid. Each search reads them first
  (`_catch_up`) into an in-memory tail compared exactly; past `TAIL_MAX` of them, the file
  is rebuilt with them, in the background: written to a temporary name, fsynced, renamed
  (atomic), the older file removed. A process killed at any instant leaves the old file,
  or the new one, and at worst a temporary file: no vector is lost, it is read again from
  the table.
- no file, or none that verifies: built anew from the table (streamed, `READ` rows at
  a time) in a background thread started by the first search that needs it; searches take
  the exact path (the scope's newest vectors) until the file is there. A process exiting
  meanwhile stops the build between batches and waits for it (`_at_exit`): a thread left
  inside usearch as the interpreter finalizes aborts the process (exit 134).
- every hit is re-checked against the scope in SQL and re-scored from its stored float32
  vector (store/vectors.py `_rescored`); a scope the over-fetched hits do not fill falls
  back to the exact search.

Several processes may share a database: each reads the newest file; two rebuilding at once
write two temporary files, and whichever renames last wins (both are complete).

Damage. usearch trusts the bytes it maps: a file changed in the middle (same size) made a
search segfault, abort ("Out of memory!") or spin, growing by gigabytes. So no byte of a
file reaches usearch before the file verifies (`_fault`): its size and the sha256 of its
content (hashed once per process open, in the thread `_open` runs in, ~0.11 s per 100 MB;
and again before a rebuild loads it) must be those its name carries, computed after usearch
wrote the temporary file and before the rename. The checksum is in the name rather than a
sidecar because the one atomic rename then publishes data and checksum together: no window
where one is new and the other old, nothing to fsync twice, nothing to orphan, and an older
build (which cannot parse the name) ignores the file. A file that does not verify is set
aside with one warning and its vectors are read again from the table (the source of truth),
so the file is rebuilt as if missing: damaged (bad checksum, wrong size, unreadable) it is
renamed `<name>.damaged` for the operator to look at (the newest one per index is kept, an
older one removed); an older build's file (no checksum in its name) is removed: it is
likely whole, but rebuilding it once is cheap, and trusting it is what this guards against.

What remains: the sha256 is not a signature. A file written with a matching name on purpose
(by someone who can write this directory, and so the database too), a file changed in place
after this process verified and mapped it (Steward never writes in place; a disk returning
other bytes for pages read later could), and a usearch bug on well-formed bytes can still
reach usearch in the serving process. Random damage, to the file or to its name, cannot:
both must change together, consistently, to pass.
"""

import asyncio
import atexit
import hashlib
import itertools
import logging
import os
import threading
import time
from pathlib import Path

from store.durable import fsync_path
from store.read.plain import run

log = logging.getLogger(__name__)

TAIL_MAX = 20_000  # vectors newer than the file, compared exactly, before it is rebuilt
READ = 10_000  # rows of entry_vectors read at a time while catching up
FIRST_FETCH = 4  # candidates asked of the index per hit wanted, at first
MAX_FETCH = 8192  # candidates at most, before the exact search takes over
_STALE_TMP = 3600.0  # seconds after which another process's temporary file is garbage
_ADD = 2048  # vectors added to a building index at a time (a process exiting waits for one)
_SUM = 32  # hex digits of the file's sha256 carried in its name

_OPEN: dict[tuple[str, str, int], "_Index"] = {}
_OPEN_LOCK = threading.Lock()
_EXITING = threading.Event()  # set at exit: builds stop between batches (`_at_exit`)


def _name(model: str, dim: int) -> str:
    return f"{hashlib.sha1(model.encode()).hexdigest()[:16]}-{dim}"


def _checksum(path: Path) -> str:
    """The sha256 of the file's bytes, as its name carries it (blocking: callers run in a
    thread, never on the event loop)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()[:_SUM]


class _Index:
    """One model's index in one database: the mapped file plus the exact tail."""

    def __init__(self, directory: Path, model: str, dim: int):
        import numpy as np

        self.np, self.directory, self.dim = np, directory, dim
        self.name = _name(model, dim)
        self.lock = threading.Lock()
        self.base = None  # the mapped usearch index, or None
        self.path: Path | None = None  # its file
        self.mark = 0  # rowid read up to (file + tail)
        self.tail_ids: list = []
        self.tail_vecs: list = []
        self.tail_len = 0
        self.building = False  # a rebuild is reading on: searches take the exact path
        self.builder: threading.Thread | None = None  # the rebuild's thread, once started
        self._open_newest()

    # -- files --

    def _files(self) -> list[tuple[int, Path]]:
        """(rowid covered up to, path) of this index's files, oldest first."""
        out = []
        for p in self.directory.glob(f"{self.name}.*.usearch"):
            parts = p.name.split(".")
            if len(parts) in (4, 5) and parts[1].isdigit():  # 4: an older build's
                out.append((int(parts[1]), p))
        return sorted(out)

    def _fault(self, path: Path) -> tuple[str, bool] | None:
        """What keeps the file from being mapped, and whether it is damaged (else only
        unverifiable); None when it verifies. FileNotFoundError: another process's rebuild
        replaced it meanwhile."""
        parts = path.name.split(".")
        if len(parts) != 5:
            return "no checksum in its name (an older build's file)", False
        size, digest = parts[2], parts[3]
        try:
            actual = path.stat().st_size
            if str(actual) != size:
                return f"{actual} bytes where its name says {size}", True
            if _checksum(path) != digest:
                return "its bytes do not match the checksum in its name", True
        except FileNotFoundError:
            raise
        except OSError as e:
            return f"unreadable ({e})", True
        return None

    def _set_aside(self, path: Path, fault: str, damaged: bool) -> None:
        """The file out of the way, said in one warning: renamed `.damaged` (the newest
        such file of this index is kept), or removed when it is only unverifiable."""
        try:
            if damaged:
                for old in self.directory.glob(f"{self.name}.*.damaged"):
                    old.unlink(missing_ok=True)
                os.replace(path, path.with_name(path.name + ".damaged"))
            else:
                path.unlink()
        except FileNotFoundError:
            return  # another process set it aside first, and said so
        except OSError as e:
            log.warning("vector index: %s: %s; not used, and could not be set aside (%s)",
                        path, fault, e)
            return
        log.warning("vector index: %s: %s; %s, its vectors are read again from "
                    "entry_vectors and the file rebuilt", path, fault,
                    f"set aside as {path.name}.damaged" if damaged else "removed")

    def _open_newest(self) -> None:
        """The newest file that verifies, mapped; each newer one that does not is set
        aside (`_fault`, `_set_aside`) before usearch sees a byte of it."""
        from usearch.index import Index

        for mark, path in reversed(self._files()):
            try:
                fault = self._fault(path)
            except FileNotFoundError:
                continue
            if fault is not None:
                self._set_aside(path, *fault)
                continue
            try:
                base = Index.restore(str(path), view=True)
            except Exception:  # noqa: BLE001 - verified, yet not usearch's: as damaged
                base = None
            if base is None or base.ndim != self.dim:
                self._set_aside(path, "verifies, but usearch cannot open it", True)
                continue
            self.base, self.path, self.mark = base, path, mark
            return

    def _forget(self) -> None:
        """No file: every vector is read again from the table, from the first rowid."""
        with self.lock:
            self.base, self.path, self.mark = None, None, 0
            self.tail_ids, self.tail_vecs, self.tail_len = [], [], 0

    def _new(self):
        from usearch.index import Index

        return Index(ndim=self.dim, metric="cos", dtype="i8", connectivity=16,
                     expansion_add=128, expansion_search=128)

    def snapshot(self) -> tuple[list, int]:
        """The tail as (ids, vectors, mark) chunks, and the mark: what a rebuild starts
        from (taken before it reads on from the mark; no search reads on meanwhile)."""
        with self.lock:
            self.building = True
            return list(zip(self.tail_ids, self.tail_vecs, [self.mark] * len(self.tail_ids),
                            strict=True)), self.mark

    def rebuild(self, chunks: list, mark: int, more) -> None:
        """The file anew: the current one's vectors, the tail `chunks`, and whatever `more`
        yields ((ids, float32 matrix, mark) chunks, read from the table), saved atomically.
        A current file that no longer verifies (or was replaced by another process) is not
        built on: the index forgets it and reads every vector again from the table, and the
        next search starts the rebuild. At exit, it stops between batches of `_ADD`."""
        from usearch.index import Index

        building, last = self._new(), mark
        if self.base is not None:
            try:
                fault = self._fault(self.path)
            except FileNotFoundError:  # another process's rebuild replaced it
                self._forget()
                return
            if fault is not None:
                self._set_aside(self.path, *fault)
                self._forget()
                return
            building = Index.restore(str(self.path), view=False)
        for ids, vecs, last in itertools.chain(chunks, more):  # noqa: B007 - last is used
            for lo in range(0, len(ids), _ADD):
                if _EXITING.is_set():
                    return  # the next process rebuilds
                building.add(ids[lo:lo + _ADD], vecs[lo:lo + _ADD], threads=2)
        if _EXITING.is_set():
            return
        tmp = self.directory / f".{self.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        building.save(str(tmp))
        os.chmod(tmp, 0o600)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        final = self.directory / (f"{self.name}.{last}.{tmp.stat().st_size}."
                                  f"{_checksum(tmp)}.usearch")
        os.replace(tmp, final)
        fsync_path(self.directory)
        base = Index.restore(str(final), view=True)
        with self.lock:
            self.base, self.mark, self.path = base, last, final
            self.tail_ids, self.tail_vecs, self.tail_len = [], [], 0
        for path in self.directory.glob(f"{self.name}.*.usearch"):
            if path != final and int(path.name.split(".")[1]) <= last:
                path.unlink(missing_ok=True)  # older, or torn
        now = time.time()
        for path in self.directory.glob(f".{self.name}.*.tmp"):
            try:
                if now - path.stat().st_mtime > _STALE_TMP:
                    path.unlink()
            except OSError:
                continue

    # -- search --

    def add_tail(self, start: int, ids, vecs, mark: int) -> bool:
        with self.lock:
            if self.mark != start:  # another search read these already
                return False
            if len(ids):
                self.tail_ids.append(ids)
                self.tail_vecs.append(vecs)
                self.tail_len += len(ids)
            self.mark = mark
            return True

    def __len__(self) -> int:
        return (len(self.base) if self.base is not None else 0) + self.tail_len

    def candidates(self, q, count: int) -> list[int]:
        np = self.np
        with self.lock:
            base, tail_ids, tail_vecs = self.base, list(self.tail_ids), list(self.tail_vecs)
        out: list[int] = []
        if base is not None and len(base):
            out += base.search(q, min(count, len(base)), exact=False).keys.tolist()
        if tail_ids:
            ids, m = np.concatenate(tail_ids), np.concatenate(tail_vecs)
            sims = m @ q
            if len(sims) > count:
                cut = np.argpartition(-sims, count - 1)[:count]
                ids = ids[cut]
            out += ids.tolist()
        return out


async def _database_file(conn) -> str | None:
    row = (await run(conn, "SELECT file FROM pragma_database_list WHERE name = 'main'")).first()
    return row[0] if row and row[0] else None


def _open(directory: Path, model: str, dim: int) -> "_Index | None":
    key = (str(directory), model, dim)
    with _OPEN_LOCK:
        ix = _OPEN.get(key)
        if ix is None:
            try:
                directory.mkdir(mode=0o700, exist_ok=True)
                if not os.access(directory, os.W_OK):
                    return None
                ix = _OPEN[key] = _Index(directory, model, dim)
            except (OSError, ImportError):
                return None
        return ix


# A model's vectors after a rowid, in the order they were stored (named parameters: run by
# the store's connections and by a rebuild's own sqlite3 connection alike).
_ROWS_AFTER = ("SELECT rowid, entry_id, CASE WHEN model = :model AND length(vec) = :w "
               "THEN vec END FROM entry_vectors WHERE rowid > :after ORDER BY rowid LIMIT :n")


def _matrix(ix: _Index, rows) -> tuple:
    """(ids, float32 matrix) of the rows that hold a vector of this model and length."""
    np = ix.np
    keep = [r for r in rows if r[2] is not None]
    ids = np.fromiter((r[1] for r in keep), dtype=np.uint64, count=len(keep))
    vecs = np.frombuffer(b"".join(r[2] for r in keep), dtype="<f4").reshape(len(keep), ix.dim)
    return ids, vecs


async def _read(conn, ix: _Index, model: str, after: int, n: int):
    """(ids, float32 matrix, last rowid, rows read) of the rows after rowid `after`."""
    rows = (await run(conn, _ROWS_AFTER, {"model": model, "w": 4 * ix.dim, "after": after,
                                          "n": n})).all()
    if not rows:
        return None
    return *_matrix(ix, rows), rows[-1][0], len(rows)


async def _catch_up(conn, ix: _Index, model: str, path: str) -> None:
    """The vectors stored since the index last looked: into the tail, or, past
    `TAIL_MAX`, into a file rebuilt in the background (`_build_in_background`)."""
    while not ix.building:
        start = ix.mark
        got = await _read(conn, ix, model, start, READ)
        if got is None:
            return
        ids, vecs, mark, n = got
        if not ix.add_tail(start, ids, vecs, mark):
            continue
        if ix.tail_len > TAIL_MAX:
            _build_in_background(ix, model, path)
            return
        if n < READ:
            return


def _build_in_background(ix: _Index, model: str, path: str) -> None:
    """The file anew with everything up to now, in a thread of its own over its own
    read-only connection: a build takes minutes at 10^5 vectors, and no search (nor the
    turn whose recall asked) waits for it; meanwhile searches take the exact path
    (`nearest` returns None). A process that exits mid-build leaves a temporary file,
    never a torn index."""
    import sqlite3

    chunks, after = ix.snapshot()  # sets `building`

    def more():
        nonlocal after
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        try:
            while rows := db.execute(_ROWS_AFTER, {"model": model, "w": 4 * ix.dim,
                                                   "after": after, "n": READ}).fetchall():
                after = rows[-1][0]
                yield *_matrix(ix, rows), after
        finally:
            db.close()

    def build():
        rows = more()
        try:
            ix.rebuild(chunks, after, rows)
        except Exception:  # noqa: BLE001 - the exact path serves; the next search retries
            log.exception("vector index: rebuild failed")
        finally:
            rows.close()
            ix.building = False

    ix.builder = threading.Thread(target=build, name="vector-index-build", daemon=True)
    ix.builder.start()


def _at_exit() -> None:
    """Builds stopped between batches, and waited for: a build thread still inside usearch
    when the interpreter finalizes aborts the process ("terminate called without an active
    exception", exit 134), as a one-shot `steward search` that started one would."""
    _EXITING.set()
    for ix in list(_OPEN.values()):
        if ix.builder is not None:
            ix.builder.join()


atexit.register(_at_exit)


def discard(directory: Path) -> int:
    """Every index file in `directory` removed (done, damaged or half-written), and this
    process's indexes of it forgotten; returns how many files went. After a forget
    (store/reclaim.py): the files hold the forgotten entries' vectors, and the next search
    builds them again from `entry_vectors`. Blocking: run it in a thread."""
    with _OPEN_LOCK:
        mine = [key for key in _OPEN if key[0] == str(directory)]
        indexes = [_OPEN.pop(key) for key in mine]
    for ix in indexes:
        if ix.builder is not None:
            ix.builder.join()
    removed = 0
    if not directory.is_dir():
        return 0
    for pattern in ("*.usearch", "*.damaged", ".*.tmp"):
        for path in directory.glob(pattern):
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                continue
    if removed:
        fsync_path(directory)
    return removed


async def idle() -> None:
    """Until no index of this process is being rebuilt (for tests and benchmarks)."""
    for ix in list(_OPEN.values()):
        if ix.builder is not None:
            await asyncio.to_thread(ix.builder.join)


async def nearest(conn, model: str, query: list[float], k: int,
                  conversation_ids: list[int] | None, *, rescore,
                  directory: Path | None = None) -> list[tuple[int, float]] | None:
    """(entry id, similarity) of the `k` best in scope, by the index; None when there is
    no index to use (a database in memory, a directory that cannot be written) or the
    scope is too small a part of it for `MAX_FETCH` candidates to fill."""
    import numpy as np

    path = await _database_file(conn)
    if not path:
        return None  # in memory: no file to index, nor to build one from
    if directory is None:
        directory = Path(path + "-vectors")
    ix = await asyncio.to_thread(_open, directory, model, len(query))
    if ix is None:
        return None
    await _catch_up(conn, ix, model, path)
    if ix.building:
        return None  # the exact path serves until the new file is there
    q = np.asarray(query, dtype=np.float32)
    q /= float(np.linalg.norm(q)) or 1.0
    fetch = FIRST_FETCH * k
    while True:
        ids = await asyncio.to_thread(ix.candidates, q, fetch)
        found = await rescore(conn, "sqlite", model, query, k, conversation_ids, ids)
        if len(found) >= k or fetch >= len(ix):
            return found
        if fetch >= MAX_FETCH:
            return None
        fetch = min(MAX_FETCH, fetch * 4)
