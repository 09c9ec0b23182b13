"""Kill a real runtime process at each dangerous point of the effect sandwich, restart it,
and count what the outside world saw."""

import asyncio
import collections
import os
import signal
import sys
from pathlib import Path

import pytest

from store import DONE, INTERRUPTED, Writes, open_store

WORKER = Path(__file__).with_name("crash_worker.py")
KINDS = ("safe", "keyed", "unsafe", "unsafe_rec")
POINTS = ("after-intent", "in-effect", "after-effect", "after-result")


async def run_worker(url: str, ledger: Path, *, kill_at: str | None = None, limit=60,
                     extra=()) -> int:
    env = {k: v for k, v in os.environ.items() if k != "STEWARD_KILL_AT"}
    if kill_at:
        env["STEWARD_KILL_AT"] = kill_at
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, str(ledger), *extra, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), limit)
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"worker exited {proc.returncode}: {err.decode()[-3000:]}")
    return proc.returncode


def ledger_counts(ledger: Path) -> dict[str, list[str]]:
    seen = collections.defaultdict(list)
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            task_id, key = line.split()
            seen[task_id].append(key)
    return seen


async def seed(url: str) -> dict[str, str]:
    """Two tasks of each effect kind and one fan-out workflow; returns the first task id of
    each kind (the one a kill point hits first: the runner works oldest first)."""
    store = await open_store(url)
    first = {}
    w = Writes()
    for n in range(2):
        for kind in KINDS:
            task_id = w.spawn(kind, {"n": n}, idem_key=f"key-{kind}-{n}")
            first.setdefault(kind, task_id)
    w.spawn("fanout", {})
    await store.commit(w)
    await store.close()
    return first


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("kind", KINDS)
async def test_kill_and_resume(store_url, tmp_path, kind, point):
    ledger = tmp_path / "ledger"
    first = await seed(store_url)
    assert await run_worker(store_url, ledger, kill_at=f"{point}:{kind}") == -signal.SIGKILL
    assert await run_worker(store_url, ledger) == 0

    store = await open_store(store_url)
    tasks = await store.list_tasks(limit=1000)
    await store.close()
    seen = ledger_counts(ledger)
    assert len(tasks) == 13  # 8 seeded effects, the fan-out and its 4 children
    killed = first[kind]
    for task in tasks:
        if task.kind == "fanout":
            assert task.state == DONE
            assert sorted(task.result) == sorted(KINDS)
            continue
        runs = seen.get(task.id, [])
        if task.id != killed or point == "after-result":
            assert (task.state, len(runs)) == (DONE, 1), task
            continue
        # The task that was killed mid-sandwich, by policy.
        if kind == "safe":
            assert task.state == DONE
            assert len(runs) == (1 if point == "after-intent" else 2)
        elif kind == "keyed":
            assert task.state == DONE
            assert len(runs) == (1 if point == "after-intent" else 2)
            assert set(runs) == {task.idem_key}  # re-sent with the same key
        elif kind == "unsafe":
            assert task.state == INTERRUPTED
            assert len(runs) == (0 if point == "after-intent" else 1)
            partial = None if point == "after-intent" else "half"
            assert task.result == {"interrupted": True, "partial": partial}
        else:  # unsafe with reconcile: looks before it leaps
            assert task.state == DONE
            assert len(runs) == 1
            assert task.result.get("reconciled", False) == (point != "after-intent")
        if task.state == DONE:
            assert task.result["n"] == 0


async def test_a_run_of_restarts_never_dead_letters_a_task(store_url, tmp_path):
    """Killed in more lives in a row than max_attempts (5), all within the crash window: a
    death is not the effect's failure, so the task is still there for the next life."""
    ledger = tmp_path / "ledger"
    store = await open_store(store_url)
    w = Writes()
    task_id = w.spawn("safe", {"n": 0})
    await store.commit(w)
    await store.close()
    codes = [await run_worker(store_url, ledger, kill_at="in-effect:safe") for _ in range(7)]
    assert codes == [-signal.SIGKILL] * 7
    assert await run_worker(store_url, ledger) == 0
    store = await open_store(store_url)
    task = await store.get_task(task_id)
    await store.close()
    assert (task.state, task.result, task.crashes) == (DONE, {"n": 0}, 0)
    assert len(ledger_counts(ledger)[task_id]) == 8


async def test_a_poison_task_is_quarantined_and_the_work_beside_it_is_done(store_url,
                                                                           tmp_path):
    """An effect that kills its process every time it runs ends, after 5 deaths spanning
    the crash window, quarantined with its reason; the effects that died beside it at
    first (in flight in the same process) are each done exactly once meanwhile."""
    ledger = tmp_path / "ledger"
    store = await open_store(store_url)
    w = Writes()
    poison = w.spawn("safe", {"n": 0})
    innocent = [w.spawn("unsafe_rec", {"n": n}) for n in range(1, 4)]
    await store.commit(w)
    await store.close()
    window = 2.0
    extra = ("--concurrency", "4", "--slow", "0.3", "--crash-window", str(window))
    codes = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not codes or codes[-1] != 0:
        assert len(codes) < 30, codes
        codes.append(await run_worker(store_url, ledger, kill_at="in-effect:safe",
                                      extra=extra))
    assert loop.time() - started >= window
    assert codes.count(-signal.SIGKILL) >= 5 and codes[-1] == 0
    store = await open_store(store_url)
    task = await store.get_task(poison)
    others = [await store.get_task(i) for i in innocent]
    await store.close()
    assert task.state == "failed", task
    assert task.error.startswith("quarantined: the process died ") and " times while " \
        "running it, over " in task.error, task.error
    assert len(ledger_counts(ledger)[poison]) == codes.count(-signal.SIGKILL)
    assert [t.state for t in others] == [DONE] * 3
    assert all(len(ledger_counts(ledger)[i]) == 1 for i in innocent)


async def _until_running(url, task_id, deadline: float = 120.0) -> None:
    """Wait for the worker to hold `task_id` (its effect starts then), however slow the
    machine: a fixed sleep lets a loaded machine signal it before it claimed anything."""
    store = await open_store(url)
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        while (await store.get_task(task_id)).state != "running":
            assert loop.time() < end, f"{task_id} was not claimed within {deadline} s"
            await asyncio.sleep(0.02)
    finally:
        await store.close()


async def _start_forever(url, ledger, *extra):
    env = {k: v for k, v in os.environ.items() if k != "STEWARD_KILL_AT"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, str(ledger), "--forever", *extra, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert (await asyncio.wait_for(proc.stdout.readline(), 30)).strip() == b"ready"
    return proc


@pytest.mark.parametrize("drain", ["finishes", "cut-short"])
async def test_sigterm_drains_and_exits_zero(store_url, tmp_path, drain):
    ledger = tmp_path / "ledger"
    store = await open_store(store_url)
    w = Writes()
    ids = [w.spawn("safe", {"n": n}) for n in range(3)]
    await store.commit(w)
    await store.close()
    extra = ("--slow", "1.0", "--drain", "10") if drain == "finishes" else (
        "--slow", "5", "--drain", "0.2")
    proc = await _start_forever(store_url, ledger, *extra)
    await _until_running(store_url, ids[0])  # inside the first effect
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]

    store = await open_store(store_url)
    states = {t.id: t.state for t in await store.list_tasks()}
    if drain == "finishes":
        assert states[ids[0]] == DONE  # the running phase finished
        assert [states[i] for i in ids[1:]] == ["pending", "pending"]
    else:
        assert states[ids[0]] == "running"  # left resumable, picked up on the next start
    await store.close()

    assert await run_worker(store_url, ledger) == 0
    store = await open_store(store_url)
    assert {t.state for t in await store.list_tasks()} == {DONE}
    await store.close()
    assert {i: len(v) for i, v in ledger_counts(ledger).items()} == {i: 1 for i in ids}
