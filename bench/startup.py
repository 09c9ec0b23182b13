"""CLI start-up: how long a person waits for `steward --help`, `sessions`, `log KEY`,
`search hello`, `tasks` and `usage`, each a whole process from exec to exit, on a home
with an SQLite store at the current schema (a conversation of 200 entries). Printed beside
two floors measured in the same run: the interpreter alone (`python -c pass`) and the
standard library any async SQLite reader loads (`import asyncio, sqlite3, json, tomllib,
argparse`). Runs interleave, so a busy minute slows every column alike; the target is
0.3 s. Bytecode is written and used, as in an install (PYTHONDONTWRITEBYTECODE is not
passed on).

`--build DIR` times another checkout of Steward beside this one, interleaved (its modules
first on the path; the same virtualenv), to show a change's effect in one run.

usage: .venv/bin/python bench/startup.py [--runs 10] [--build DIR] [--json]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":
    sys.path[0] = str(ROOT)  # this file's name would shadow the `store` package

from store import Writes, open_store  # noqa: E402

COMMANDS = (["--help"], ["sessions"], ["log", "cli:bench"], ["search", "hello"], ["tasks"],
            ["usage"])
FLOORS = {"python -c pass": "pass",
          "stdlib floor": "import asyncio, sqlite3, json, tomllib, argparse"}
TARGET = 0.3


async def make_home(home: Path) -> None:
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    try:
        conv = await store.ensure_conversation("cli:bench")
        for n in range(100):
            writes = Writes()
            writes.append(conv.id, "message", f"hello number {n}", author="user")
            writes.append(conv.id, "message", f"answer {n}", author="steward")
            await store.commit(writes)
    finally:
        await store.close()


def timed(argv: list[str], env: dict) -> float:
    start = time.perf_counter()
    # From the home: `-m` puts the working directory first on the path, and a checkout
    # there would shadow --build.
    subprocess.run(argv, env=env, cwd=env["STEWARD_HOME"], stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--build", help="another checkout to time beside this one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="steward-startup-") as tmp:
        home = Path(tmp) / "home"
        home.mkdir(mode=0o700)
        asyncio.run(make_home(home))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("STEWARD_", "XDG_", "PYTHON"))}
        env.update(STEWARD_HOME=str(home), XDG_CONFIG_HOME=str(Path(tmp) / "xdg"))
        builds = {"this build": env}
        if args.build:
            builds["--build"] = {**env, "PYTHONPATH": str(Path(args.build).resolve())}
        cases = {name: [sys.executable, "-c", code] for name, code in FLOORS.items()}
        for build, build_env in builds.items():
            for command in COMMANDS:
                cases[f"{build}: steward {' '.join(command)}"] = (
                    [sys.executable, "-m", "bot.app.cli", *command], build_env)
        # Untimed first round: bytecode written, the config validated and remembered.
        for case in cases.values():
            argv, case_env = case if isinstance(case, tuple) else (case, env)
            timed(argv, case_env)
        seconds: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.runs):
            for name, case in cases.items():
                argv, case_env = case if isinstance(case, tuple) else (case, env)
                seconds[name].append(timed(argv, case_env))
    figures = {name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s)}
               for name, s in seconds.items()}
    floor = figures["stdlib floor"]["median_s"]
    for fig in figures.values():
        fig["x_stdlib_floor"] = fig["median_s"] / floor
    if args.json:
        print(json.dumps({"runs": args.runs, "target_s": TARGET, **figures}, indent=2))
        return
    width = max(map(len, figures)) + 2
    print(f"{'command':<{width}}{'median s':>9}{'min':>7}{'max':>7}{'x floor':>9}  "
          f"(target {TARGET} s)")
    for name, fig in figures.items():
        print(f"{name:<{width}}{fig['median_s']:>9.3f}{fig['min_s']:>7.3f}{fig['max_s']:>7.3f}"
              f"{fig['x_stdlib_floor']:>9.2f}")


if __name__ == "__main__":
    main()
