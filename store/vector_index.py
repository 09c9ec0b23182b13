"""SQLite's approximate index of entry embeddings: a usearch HNSW file beside the database.

PostgreSQL has pgvector in the server; SQLite here cannot load extensions (this Python's
sqlite3 has no `enable_load_extension`) and sqlite-vec would only be exact. So the index
of a model's vectors is a usearch file (int8, cosine) in `<database>-vectors/`, memory-
mapped (`view`: its pages are the kernel's cache, not this process's heap). The store stays
the source of truth:

- the file's name carries the `entry_vectors` rowid it covers up to and its size
  (`<model>.<rowid>.<bytes>.usearch`: a file of another size is never mapped);
  rowids only grow (SQLite has one writer, and no vector row is ever deleted), so the
  vectors stored since are exactly those with a larger rowid. Each search reads them first
  (`_catch_up`) into an in-memory tail compared exactly; past `TAIL_MAX` of them, the file
  is rebuilt with them, in the background: written to a temporary name, fsynced, renamed
  (atomic), the older file removed. A process killed at any instant leaves the old file,
  or the new one, and at worst a temporary file: no vector is lost, it is read again from
  the table.
- no file, or one that does not open: built anew from the table (streamed, `READ` rows at
  a time) in a background thread started by the first search that needs it; searches take
  the exact path (the scope's newest vectors) until the file is there.
- every hit is re-checked against the scope in SQL and re-scored from its stored float32
  vector (store/vectors.py `_rescored`); a scope the over-fetched hits do not fill falls
  back to the exact search.

Several processes may share a database: each reads the newest file; two rebuilding at once
write two temporary files, and whichever renames last wins (both are complete).
"""

import asyncio
import hashlib
import itertools
import logging
import os
import threading
import time
from pathlib import Path

from store.plain import run

log = logging.getLogger(__name__)

TAIL_MAX = 20_000  # vectors newer than the file, compared exactly, before it is rebuilt
READ = 10_000  # rows of entry_vectors read at a time while catching up
FIRST_FETCH = 4  # candidates asked of the index per hit wanted, at first
MAX_FETCH = 8192  # candidates at most, before the exact search takes over
_STALE_TMP = 3600.0  # seconds after which another process's temporary file is garbage

_OPEN: dict[tuple[str, str, int], "_Index"] = {}
_OPEN_LOCK = threading.Lock()


def _name(model: str, dim: int) -> str:
    return f"{hashlib.sha1(model.encode()).hexdigest()[:16]}-{dim}"


class _Index:
    """One model's index in one database: the mapped file plus the exact tail."""

    def __init__(self, directory: Path, model: str, dim: int):
        import numpy as np

        self.np, self.directory, self.dim = np, directory, dim
        self.name = _name(model, dim)
        self.lock = threading.Lock()
        self.base = None  # the mapped usearch index, or None
        self.path: Path | None = None  # its file
        self.base_mark = 0  # rowid the file covers up to
        self.mark = 0  # rowid read up to (file + tail)
        self.tail_ids: list = []
        self.tail_vecs: list = []
        self.tail_len = 0
        self.building = False  # a rebuild is reading on: searches take the exact path
        self.builder: threading.Thread | None = None  # the rebuild's thread, once started
        self._open_newest()

    # -- files --

    def _files(self) -> list[tuple[int, Path]]:
        out = []
        for p in self.directory.glob(f"{self.name}.*.*.usearch"):
            try:
                _, mark, size, _ = p.name.split(".")
                if p.stat().st_size == int(size):  # whole, as written (else never mapped)
                    out.append((int(mark), p))
            except (ValueError, OSError):
                continue
        return sorted(out)

    def _open_newest(self) -> None:
        from usearch.index import Index

        for mark, path in reversed(self._files()):
            self.path = path
            try:
                base = Index.restore(str(path), view=True)
            except Exception:  # noqa: BLE001 - unreadable: the next older, or a rebuild
                continue
            if base is not None and base.ndim == self.dim:
                self.base, self.base_mark, self.mark = base, mark, mark
                return

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
        yields ((ids, float32 matrix, mark) chunks, read from the table), saved atomically."""
        from usearch.index import Index

        building, last = self._new(), mark
        if self.base is not None:
            building = Index.restore(str(self.path), view=False)
        for ids, vecs, last in itertools.chain(chunks, more):  # noqa: B007 - last is used
            if len(ids):
                building.add(ids, vecs, threads=2)
        tmp = self.directory / f".{self.name}.{os.getpid()}.{threading.get_ident()}.tmp"
        building.save(str(tmp))
        os.chmod(tmp, 0o600)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        final = self.directory / f"{self.name}.{last}.{tmp.stat().st_size}.usearch"
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        base = Index.restore(str(final), view=True)
        with self.lock:
            self.base, self.base_mark, self.mark, self.path = base, last, last, final
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


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        try:
            ix.rebuild(chunks, after, more())
        except Exception:  # noqa: BLE001 - the exact path serves; the next search retries
            log.exception("vector index: rebuild failed")
        finally:
            ix.building = False

    ix.builder = threading.Thread(target=build, name="vector-index-build", daemon=True)
    ix.builder.start()


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
