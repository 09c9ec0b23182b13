"""SQLite's index file damaged the way disks and people damage files: bytes changed in the
middle, zero-filled, truncated (each at the size and name it had), and an older build's file
without a checksum. The search that meets it runs in a real process, so a segfault shows
as its exit status, not as pytest dying: it exits 0 with the right hits, the file is set
aside with exactly one warning, and the file rebuilt from `entry_vectors` verifies."""

import asyncio
import json
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from store import vector_index
from tests.test_vector_index import brute, fill, near, unit

ROOT = Path(__file__).resolve().parent.parent
N, WINDOW, K = 1000, 100, 5
OLD = (3, 250, 500, 990)  # entries searched for once the file is rebuilt; 990 is in the window

_PRELUDE = r"""
import asyncio, json, logging, random, resource, sys
from pathlib import Path

resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a runaway dies, not the box
logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                    format="%(levelname)s:%(name)s:%(message)s")
from store import open_store, vector_index
from store import vectors as _vectors

vector_index.TAIL_MAX, vector_index.READ = 300, 250
url, queries, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]


async def near(store, q):
    async with store.reading() as conn:
        found = await _vectors.nearest(conn, "sqlite", "test-model:v1", q,
                                       conversation_ids=None, k=5, window=100)
    return [n.id for n in found]
"""

# A process meeting the file: one search (the rebuild starts; the exact path answers), then,
# unless told to exit at once, the rebuild waited for and every query searched again.
_SEARCH = _PRELUDE + r"""
async def main():
    store = await open_store(url)
    out = {"first": await near(store, queries[0])}
    if mode == "wait":
        await vector_index.idle()
        out["later"] = [await near(store, q) for q in queries]
    print(json.dumps(out), flush=True)
    await store.close()

asyncio.run(main())
"""

# A process that maps the file while it verifies, then sees it damaged in place before the
# rebuild that new vectors start would load it.
_MAPPED = _PRELUDE + r"""
import numpy as np
from tests.test_vector_index import bulk_entries, unit


async def main():
    store = await open_store(url)
    await near(store, queries[0])  # the file verifies, and is mapped
    path = next(Path(url.split("///", 1)[1] + "-vectors").glob("*.usearch"))
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.seek(size // 2 - 2048)
        f.write(random.Random(1).randbytes(4096))
    conv = await store.ensure_conversation("cli:more")
    new = unit(np.random.default_rng(9), 400)
    async with store.engines.write.begin() as conn:
        ids = await bulk_entries(conn, "sqlite", conv.id, 400)
        await _vectors.put(conn, "sqlite", "test-model:v1", [
            (e, conv.id, v.astype("<f4").tobytes()) for e, v in zip(ids, new)])
    await near(store, queries[0])  # past TAIL_MAX: a rebuild, which finds the file damaged
    await vector_index.idle()
    await near(store, queries[0])  # every vector read again: the file built anew
    await vector_index.idle()
    out = {"later": [await near(store, q) for q in queries],
           "new": [(await near(store, list(map(float, new[7]))))[0], ids[7]]}
    print(json.dumps(out), flush=True)
    await store.close()

asyncio.run(main())
"""


async def _run(script: str, url: str, queries, mode: str = "wait") -> tuple[dict, list[str]]:
    """(what the process printed, its log lines from store.vector_index); it must exit 0
    within minutes (a hang is killed and fails, a crash shows as its signal)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, url, json.dumps([list(map(float, q)) for q in queries]),
        mode, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 300)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail("the search hung on the index file")
    err = err.decode(errors="replace")
    assert proc.returncode == 0, (proc.returncode, err[-3000:])  # -11: a segfault
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ":store.vector_index:" in ln]
    return json.loads(out.decode().splitlines()[-1]), lines


async def _built(store, tmp_path, monkeypatch) -> tuple[list[int], np.ndarray, Path]:
    """N entries with vectors and the index file of them, built through the store."""
    monkeypatch.setattr(vector_index, "TAIL_MAX", 300)
    monkeypatch.setattr(vector_index, "READ", 250)
    monkeypatch.setattr(vector_index, "_OPEN", {})
    vecs = unit(np.random.default_rng(11), N)
    _, ids = await fill(store, "cli:c", vecs)
    await near(store, vecs[0], None, K, window=WINDOW)  # starts the build
    await vector_index.idle()
    files = list((tmp_path / "steward.db-vectors").glob("*.usearch"))
    assert len(files) == 1
    monkeypatch.setattr(vector_index, "_OPEN", {})  # this process never maps it again
    return ids, vecs, files[0]


def _verifies(directory: Path) -> Path:
    """The one index file there, whose name carries its size and sha256 as they are."""
    files = list(directory.glob("*.usearch"))
    assert len(files) == 1, files
    parts = files[0].name.split(".")
    assert len(parts) == 5, files[0].name
    assert files[0].stat().st_size == int(parts[2])
    assert vector_index._checksum(files[0]) == parts[3]
    return files[0]


def _found_again(out: dict, ids) -> None:
    """Each of the `OLD` entries, the last queries asked, found first by the rebuilt file."""
    for i, got in zip(OLD, out["later"][-len(OLD):], strict=True):
        assert got[0] == ids[i], i
        assert len(got) == K


def _damage(path: Path, how: str) -> None:
    size = path.stat().st_size
    if how == "truncated":
        os.truncate(path, size // 2)
        return
    with open(path, "r+b") as f:  # in place: the same file, name and size
        if how == "zero-filled":
            f.write(bytes(size))
        else:
            f.seek(size // 2 - 2048)
            f.write(random.Random(7).randbytes(4096))


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("how", ["bytes changed in the middle", "zero-filled", "truncated"])
async def test_a_damaged_index_file_is_set_aside_and_rebuilt_from_the_table(
        store, store_url, tmp_path, monkeypatch, how):
    ids, vecs, path = await _built(store, tmp_path, monkeypatch)
    _damage(path, how)
    queries = [vecs[990]] + [vecs[i] for i in OLD]
    out, logged = await _run(_SEARCH, store_url, queries)
    # meanwhile the exact path answered: the scope's newest WINDOW, compared exactly
    assert out["first"] == brute(ids[-WINDOW:], vecs[-WINDOW:], vecs[990], K)
    assert out["first"][0] == ids[990]
    _found_again(out, ids)
    assert len(logged) == 1, logged
    assert logged[0].startswith("WARNING:") and path.name in logged[0], logged
    assert "rebuilt" in logged[0]
    assert not path.exists()
    assert path.with_name(path.name + ".damaged").exists()
    assert _verifies(path.parent) != path


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_an_older_builds_file_without_a_checksum_is_rebuilt_once(
        store, store_url, tmp_path, monkeypatch):
    ids, vecs, path = await _built(store, tmp_path, monkeypatch)
    model, mark, size = path.name.split(".")[:3]
    older = path.rename(path.with_name(f"{model}.{mark}.{size}.usearch"))  # as it named them
    queries = [vecs[990]] + [vecs[i] for i in OLD]
    out, logged = await _run(_SEARCH, store_url, queries)
    _found_again(out, ids)
    assert len(logged) == 1 and logged[0].startswith("WARNING:"), logged
    assert "no checksum" in logged[0] and "removed" in logged[0]
    assert not older.exists() and not list(path.parent.glob("*.damaged"))
    rebuilt = _verifies(path.parent)
    out, logged = await _run(_SEARCH, store_url, queries)  # the next process: trusted
    assert logged == []
    assert out["first"][0] == ids[990]
    _found_again(out, ids)
    assert _verifies(path.parent) == rebuilt


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_file_damaged_after_it_was_mapped_is_not_built_on(
        store, store_url, tmp_path, monkeypatch):
    """The rebuild loads the current file to add the new vectors to it: it checks it
    again first, and reads every vector from the table instead."""
    ids, vecs, path = await _built(store, tmp_path, monkeypatch)
    out, logged = await _run(_MAPPED, store_url, [vecs[i] for i in OLD])
    _found_again(out, ids)
    assert out["new"][0] == out["new"][1]
    assert len(logged) == 1 and "checksum" in logged[0], logged
    assert path.with_name(path.name + ".damaged").exists()
    _verifies(path.parent)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_search_that_exits_while_the_index_is_rebuilt_exits_cleanly(
        store, store_url, tmp_path, monkeypatch):
    """A one-shot search (`steward search`) starts the rebuild of a set-aside file and
    exits at once: the build stops between batches, rather than aborting the process
    (exit 134) from inside usearch, and the next process builds the file."""
    ids, vecs, path = await _built(store, tmp_path, monkeypatch)
    await fill(store, "cli:more", unit(np.random.default_rng(12), 20_000))
    _damage(path, "bytes changed in the middle")
    out, logged = await _run(_SEARCH, store_url, [vecs[990]], mode="exit")
    assert len(logged) == 1, logged
    assert not list(path.parent.glob(".*.tmp"))  # stopped before it saved (or done)
    if list(path.parent.glob("*.usearch")):
        _verifies(path.parent)
    out, logged = await _run(_SEARCH, store_url, [vecs[i] for i in OLD])
    _found_again(out, ids)
    _verifies(path.parent)
