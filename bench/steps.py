"""Step benchmark: one step of the common shape (what a turn's phase commits: an entry, a
spawned child, the task waiting for it) through the general commit (store/commit.py, built
with SQLAlchemy) and through the fixed statements (store/steps.py), alternating, on
SQLite and PostgreSQL; beside them in the same run the floor, one raw commit (stdlib
sqlite3 WAL synchronous=FULL / asyncpg), and each one's ratio to it.

usage: .venv/bin/python bench/steps.py [--backend sqlite|postgres|both] [--steps 400]
"""

import argparse
import asyncio
import logging
import sys
import time
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path and its name shadows the
# `store` package: put the project root there instead.
if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.store import (  # noqa: E402
    floor,
    note,
    p50_p99,
    postgres_url,
    print_table,
    sqlite_url,
)
from store import WAITING, Claim, TaskUpdate, Writes, open_store  # noqa: E402
from store import commit as _commit  # noqa: E402
from store import steps as _steps  # noqa: E402


def _step(conversation_id: int, task_id: str) -> Writes:
    step = Writes()
    step.append(conversation_id, "assistant", "x" * 200, data={"answers_upto": 1},
                task_id=task_id)
    step.spawn("child", {"request_json": "y" * 2000}, parent_id=task_id,
               conversation_id=conversation_id)
    step.task_update = TaskUpdate(task_id, "bench", WAITING, "after", checkpoint={"n": 1},
                                  wait_mode="all")
    return step


async def run_backend(url: str, n: int) -> dict:
    store = await open_store(url)
    seconds: dict[str, list[float]] = {"general": [], "fixed": []}
    try:
        conversation = await store.ensure_conversation("bench:steps")
        for i in range(n * 2):
            spawn = Writes()
            spawn.spawn("turn", {}, conversation_id=conversation.id)
            await store.commit(spawn)
            [task] = await store.claim(Claim("bench", 1, 60.0))
            step = _step(conversation.id, task.id)
            assert _steps.fits(step)
            general = i % 2 == 0
            start = time.perf_counter()
            if general:
                await store._write(lambda conn, step=step: _commit.apply(conn, store.dialect,
                                                                         step))
            else:
                await store.commit(step)  # a step that fits: store/steps.py
            seconds["general" if general else "fixed"].append(time.perf_counter() - start)
    finally:
        await store.close()
    one = (await floor(url, (1,)))[1]
    out = {"floor: 1 raw commit p50 (ms)": one}
    for name, label in (("general", "general commit"), ("fixed", "fixed statements")):
        p50, p99 = p50_p99(seconds[name])
        out[f"{label} p50/p99 (ms)"] = [p50, p99]
        out[f"{label} p50 / floor"] = p50 / one
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--steps", type=int, default=400, help="steps of each kind")
    args = parser.parse_args()
    backends = {"sqlite": sqlite_url, "postgres": postgres_url}
    chosen = list(backends) if args.backend == "both" else [args.backend]
    figures = {}
    for name in chosen:
        note(f"{name}: {args.steps} steps each way, alternating")
        async with backends[name]() as url:
            figures[name] = await run_backend(url, args.steps)
    print_table(figures)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
