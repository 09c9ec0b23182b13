"""Several workers on one PostgreSQL: steps/s with 1, 2 and 4 worker processes.

In a fresh database (created next to `test`, dropped at the end), migrated by the store's
own code, N trivial safe-effect tasks (claim, then result: two commits each) are queued;
then K worker processes, each a real `Runner` at the given concurrency, run them until no
task is ready. Each worker connects, warms its pools and says it is ready; the clock starts
when all of them are told to go and stops when the parent, polling the tasks table, counts
all N done. Each task must have run exactly once (every worker reports each effect it
performed; the table must show every task done, never taken over, by the worker that
reported it), else FAIL and exit 1.

The floor, in the same run: the same N claim+result pairs as raw asyncpg commits (two
autocommitted one-row UPDATEs each, as bench/store.py's floor), by K concurrent
connections, each on a row of its own.

The machine is shared, so rounds over all K alternate and the best round of each K is
reported, with the CPU it used (cores: the workers' processes, the PostgreSQL backends
serving them, the whole machine with whatever else runs on it) to tell a saturated machine
from a contended database.

usage: .venv/bin/python bench/workers.py [--tasks 3000] [--workers 1,2,4]
           [--concurrency 16] [--poll 0.01] [--repeat 3] [--json]
"""

import argparse
import asyncio
import collections
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path

import asyncpg
from sqlalchemy import make_url

# Run as a script, this file's directory comes first on sys.path and its sibling store.py
# shadows the `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bot.runtime import Effect, Policy, Registry, Runner, RunnerOptions  # noqa: E402
from store import DONE, Writes, open_store  # noqa: E402

PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
KIND_SAFE = "bench.safe"
POLL_SECONDS = 0.01  # the parent's poll of the done count
READY_TIMEOUT = 60.0
POOL_WARM = 10  # the store's hot-path pool size (store/engine.py)
SCRIPT = str(Path(__file__).resolve())


def note(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _connect_args(url: str) -> dict:
    u = make_url(url)
    return dict(host=u.host, port=u.port, user=u.username, password=u.password,
                database=u.database)


# -- a worker process ----------------------------------------------------------------------


class SafeNoop(Effect):
    """A safe effect with no I/O (claim, then result: two commits) that notes, in this
    process, every time it is performed."""

    kind = KIND_SAFE
    policy = Policy.SAFE

    def __init__(self, index: int):
        self.index = index
        self.performed: list[str] = []

    async def perform(self, ctx):
        self.performed.append(ctx.task.id)
        return {"worker": self.index, "i": ctx.inputs["i"]}


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def worker(url: str, index: int, concurrency: int, poll: float) -> None:
    """Connect, warm up, say `ready`, wait for `go` on stdin, run until idle, print one JSON
    line (what this process performed), then stay connected until stdin closes (so the
    parent can still read what its server processes spent)."""
    store = await open_store(url, upgrade=False)
    try:
        effect = SafeNoop(index)
        runner = Runner(store, Registry(effect),
                        RunnerOptions(concurrency=concurrency, poll_seconds=poll))
        await runner.recover(steal_all=False)  # others share the store
        # Open the connections a run would otherwise open on its first steps.
        pool = await store.engines.pool()
        conns = [await pool.acquire() for _ in range(POOL_WARM)]
        for conn in conns:
            await pool.release(conn)
        await store.next_due()
        _say("ready")
        go = await asyncio.to_thread(sys.stdin.readline)
        if go.strip() != "go":
            raise SystemExit(f"worker {index}: expected 'go', got {go!r}")
        t0, cpu0 = time.perf_counter(), time.process_time()
        await runner.run(until_idle=True)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        _say(json.dumps({"index": index, "pid": os.getpid(), "owner": runner.owner,
                         "wall": wall, "cpu": cpu, "performed": effect.performed}))
        await asyncio.to_thread(sys.stdin.read)
    finally:
        await store.close()


# -- the parent ----------------------------------------------------------------------------


class Fail(Exception):
    pass


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine, from /proc/stat (Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _busy(before, after) -> float | None:
    """The machine's busy share of all cores between two `_cpu_ticks`."""
    if before is None or after is None or after[1] == before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


_BACKENDS = ("SELECT pid FROM pg_stat_activity "
             "WHERE datname = current_database() AND pid <> pg_backend_pid()")


def _proc_ticks(pids) -> dict[int, int]:
    """user+system jiffies of each of these processes (/proc, Linux); none for one gone."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[pid] = int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            continue
    return out


async def _backend_ticks(conn) -> dict[int, int]:
    """The same for the server processes serving this database (the server runs on this
    machine). Reading /proc does not block."""
    return _proc_ticks([pid for (pid,) in await conn.fetch(_BACKENDS)])


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(**_connect_args(PG_URL))
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _reset(url: str) -> None:
    """Empty the queue between runs, so every K starts from the same table."""
    conn = await asyncpg.connect(**_connect_args(url))
    try:
        await conn.execute("TRUNCATE tasks CASCADE")
        await conn.execute("DROP TABLE IF EXISTS floor")
        await conn.execute("VACUUM ANALYZE tasks")
    finally:
        await conn.close()


async def enqueue(url: str, n: int) -> set[str]:
    store = await open_store(url, upgrade=False)
    try:
        writes = Writes()
        ids = {writes.spawn(KIND_SAFE, {"i": i}) for i in range(n)}
        await store.commit(writes)
    finally:
        await store.close()
    conn = await asyncpg.connect(**_connect_args(url))
    try:
        await conn.execute("ANALYZE tasks")
    finally:
        await conn.close()
    return ids


async def _start(url: str, index: int, concurrency: int, poll: float):
    return await asyncio.create_subprocess_exec(
        sys.executable, SCRIPT, "--worker", url,
        "--index", str(index), "--concurrency", str(concurrency), "--poll", str(poll),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        limit=2**26)  # the report line lists every task performed


async def _line(proc, what: str, seconds: float) -> str:
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), seconds)
    except TimeoutError:
        raise Fail(f"worker pid {proc.pid}: no {what} within {seconds:.0f}s") from None
    if not line:
        code = await proc.wait()
        raise Fail(f"worker pid {proc.pid} exited ({code}) before its {what}")
    return line.decode().strip()


async def _stop(procs) -> None:
    """Kill, by pid, the workers started here that are still running."""
    for proc in procs:
        if proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
    for proc in procs:
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            note(f"worker pid {proc.pid} did not exit after SIGKILL")


async def run_workers(url: str, ids: set[str], k: int, concurrency: int, poll: float,
                      limit: float) -> dict:
    n = len(ids)
    procs = []
    try:
        procs = [await _start(url, i, concurrency, poll) for i in range(k)]
        for proc in procs:
            if await _line(proc, "ready", READY_TIMEOUT) != "ready":
                raise Fail(f"worker pid {proc.pid}: unexpected first line")
        poller = await asyncpg.connect(**_connect_args(url))
        try:
            count = "SELECT count(*) FROM tasks WHERE state = $1"
            await poller.fetchval(count, DONE)
            backends0 = await _backend_ticks(poller)
            for proc in procs:
                proc.stdin.write(b"go\n")
            t0, ticks0 = time.perf_counter(), _cpu_ticks()
            for proc in procs:
                await proc.stdin.drain()
            done = 0
            while done < n:
                await asyncio.sleep(POLL_SECONDS)
                done = await poller.fetchval(count, DONE)
                if time.perf_counter() - t0 > limit:
                    raise Fail(f"K={k}: only {done}/{n} tasks done after {limit:.0f}s")
            wall, busy = time.perf_counter() - t0, _busy(ticks0, _cpu_ticks())
            backends = await _backend_ticks(poller)  # the workers are still connected
            server = sum(t - backends0.get(pid, 0) for pid, t in backends.items())
            server /= os.sysconf("SC_CLK_TCK")
            reports = [json.loads(await _line(p, "report", limit)) for p in procs]
            for proc in procs:
                proc.stdin.close()
            for proc in procs:
                if (code := await asyncio.wait_for(proc.wait(), limit)) != 0:
                    raise Fail(f"worker pid {proc.pid} exited {code}")
            rows = await poller.fetch("SELECT id, state, crashes, lease_owner, result "
                                      "FROM tasks")
        finally:
            await poller.close()
    finally:
        await _stop(procs)
    worker_cpu = [r["cpu"] for r in sorted(reports, key=lambda r: r["index"])]
    return {"wall (s)": wall, "steps/s": n / wall, "machine CPU busy": busy,
            "worker CPU s": worker_cpu, "worker cores": sum(worker_cpu) / wall,
            "server cores": server / wall, **verify(ids, reports, rows, k)}


def verify(ids: set[str], reports: list[dict], rows, k: int) -> dict:
    """Every task ran exactly once, and the table agrees with the workers' own reports."""
    problems = []
    performed = collections.Counter(t for r in reports for t in r["performed"])
    by_worker = {t: r["index"] for r in reports for t in r["performed"]}
    twice = [t for t, c in performed.items() if c > 1]
    never = ids - set(performed)
    strangers = set(performed) - ids
    if twice:
        problems.append(f"{len(twice)} tasks performed more than once, e.g. {twice[:3]}")
    if never:
        problems.append(f"{len(never)} tasks never performed, e.g. {sorted(never)[:3]}")
    if strangers:
        problems.append(f"{len(strangers)} unknown tasks performed")
    table = {r["id"]: r for r in rows}
    if set(table) != ids:
        problems.append(f"the table holds {len(table)} tasks, {len(ids)} were queued")
    not_done = [t for t, r in table.items() if r["state"] != DONE]
    taken_over = [t for t, r in table.items() if r["crashes"]]
    held = [t for t, r in table.items() if r["lease_owner"] is not None]
    mismatched = [t for t, r in table.items()
                  if r["result"] is None
                  or json.loads(r["result"]).get("worker") != by_worker.get(t)]
    for what, found in (("not done", not_done), ("taken over from a worker", taken_over),
                        ("still leased", held),
                        ("with a result from another worker than reported", mismatched)):
        if found:
            problems.append(f"{len(found)} tasks {what}, e.g. {found[:3]}")
    per_worker = [len(r["performed"]) for r in sorted(reports, key=lambda r: r["index"])]
    if len(per_worker) != k:
        problems.append(f"{len(per_worker)} reports from {k} workers")
    return {"tasks per worker": per_worker, "problems": problems}


async def pg_floor(url: str, n: int, k: int) -> float:
    """Seconds for `n` claim+result pairs as raw commits (two autocommitted one-row UPDATEs
    each), shared out over `k` concurrent connections, each updating a row of its own."""
    conns = [await asyncpg.connect(**_connect_args(url)) for _ in range(k)]
    try:
        await conns[0].execute("CREATE TABLE IF NOT EXISTS floor (id int PRIMARY KEY, v int)")
        await conns[0].execute("INSERT INTO floor SELECT g, 0 FROM generate_series(0, $1) g "
                               "ON CONFLICT DO NOTHING", k - 1)
        sql = "UPDATE floor SET v = v + 1 WHERE id = $1"
        for i, conn in enumerate(conns):  # prepare, outside the clock
            await conn.execute(sql, i)

        async def pairs(i: int, conn, count: int) -> None:
            for _ in range(count):
                await conn.execute(sql, i)  # the claim
                await conn.execute(sql, i)  # the result

        shares = [n // k + (i < n % k) for i in range(k)]
        t0 = time.perf_counter()
        await asyncio.gather(*(pairs(i, conn, share) for i, (conn, share)
                               in enumerate(zip(conns, shares, strict=True))))
        return time.perf_counter() - t0
    finally:
        for conn in conns:
            await conn.close()


async def run(args) -> dict:
    ks = [int(s) for s in args.workers.split(",") if s]
    if not ks or min(ks) < 1:
        raise SystemExit("--workers: a list of positive counts, e.g. 1,2,4")
    name = f"steward_bench_workers_{uuid.uuid4().hex[:12]}"
    url = make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    timeout = max(60.0, args.tasks / 20)
    figures: dict = {"tasks": args.tasks, "concurrency": args.concurrency,
                     "repeat": args.repeat, "workers": {}}
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        note(f"database {name}: migrating")
        store = await open_store(url)  # migrates: the store's own code
        await store.close()
        runs: dict[int, list[dict]] = {k: [] for k in ks}
        floors: dict[int, list[float]] = {k: [] for k in ks}
        for r in range(args.repeat):  # round after round, so each K sees the same machine
            for k in ks:
                await _reset(url)
                note(f"round {r + 1}/{args.repeat} K={k}: floor, {args.tasks} raw "
                     f"claim+result pairs on {k} connections")
                floors[k].append(args.tasks / await pg_floor(url, args.tasks, k))
                note(f"round {r + 1}/{args.repeat} K={k}: {args.tasks} tasks, {k} workers "
                     f"x concurrency {args.concurrency}")
                ids = await enqueue(url, args.tasks)
                runs[k].append(await run_workers(url, ids, k, args.concurrency, args.poll,
                                                 timeout))
    finally:
        try:
            await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception as exc:  # report, but do not hide the run's own error
            note(f"could not drop database {name}: {exc!r}")
    for k in ks:  # the best of the rounds (the machine is shared), every round's check
        best = max(runs[k], key=lambda fig: fig["steps/s"])
        figures["workers"][k] = {
            **best, "steps/s runs": [fig["steps/s"] for fig in runs[k]],
            "floor pairs/s": max(floors[k]), "floor pairs/s runs": floors[k],
            "problems": [p for fig in runs[k] for p in fig["problems"]]}
    figures["base K"] = b = 1 if 1 in ks else ks[0]
    base = figures["workers"][b]
    for fig in figures["workers"].values():
        fig[f"ratio to K={b}"] = fig["steps/s"] / base["steps/s"]
        fig[f"floor ratio to K={b}"] = fig["floor pairs/s"] / base["floor pairs/s"]
        fig["steps/s / floor pairs/s"] = fig["steps/s"] / fig["floor pairs/s"]
    return figures


def report(figures: dict) -> None:
    b = figures["base K"]
    rows = [("K", "steps/s", f"x K={b}", "(all rounds)", "floor pairs/s", f"x K={b}",
             "/ floor", "tasks per worker", "CPU: workers", "server", "machine", "check")]
    for k, f in figures["workers"].items():
        busy = f["machine CPU busy"]
        rows.append((str(k), f"{f['steps/s']:,.0f}", f"{f[f'ratio to K={b}']:.2f}",
                     " ".join(f"{v:,.0f}" for v in f["steps/s runs"]),
                     f"{f['floor pairs/s']:,.0f}", f"{f[f'floor ratio to K={b}']:.2f}",
                     f"{f['steps/s / floor pairs/s']:.2f}",
                     " ".join(str(n) for n in f["tasks per worker"]),
                     f"{f['worker cores']:.2f}", f"{f['server cores']:.2f}",
                     "?" if busy is None else f"{busy * os.cpu_count():.2f}",
                     "FAIL" if f["problems"] else "ok"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"{figures['tasks']} tasks, concurrency {figures['concurrency']} per worker, best "
          f"of {figures['repeat']} rounds. floor: as many raw claim+result pairs (two "
          "commits each) on K connections, best of the rounds. CPU, in cores over the best "
          f"round: the workers', the PostgreSQL backends serving them, the whole machine's "
          f"({os.cpu_count()} cores, other work included).")
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    for k, f in figures["workers"].items():
        for problem in f["problems"]:
            print(f"FAIL K={k}: {problem}")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--workers", default="1,2,4", help="worker process counts")
    parser.add_argument("--concurrency", type=int, default=16, help="per worker")
    parser.add_argument("--poll", type=float, default=0.01, help="the runners' poll_seconds")
    parser.add_argument("--repeat", type=int, default=3,
                        help="rounds over all K; the best of them is reported")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        await worker(args.worker, args.index, args.concurrency, args.poll)
        return 0
    try:
        figures = await run(args)
    except Fail as exc:
        print(f"FAIL: {exc}")
        return 1
    failed = any(f["problems"] for f in figures["workers"].values())
    if args.json:
        print(json.dumps(figures, indent=2))
        if failed:
            print("FAIL", file=sys.stderr)
    else:
        report(figures)
    return 1 if failed else 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main()))
