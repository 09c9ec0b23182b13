"""SIGUSR1 makes `steward run` log where each of its asyncio tasks is waiting: the way to
see what a process that looks stuck is stuck on, without stopping it."""

import asyncio
import io
import logging
import signal

log = logging.getLogger(__name__)


def dump_tasks() -> None:
    out = io.StringIO()
    tasks = asyncio.all_tasks()
    for task in sorted(tasks, key=lambda t: t.get_name()):
        out.write(f"--- {task.get_name()}: {task.get_coro()!r}\n")
        task.print_stack(limit=12, file=out)
    log.warning("%d tasks (SIGUSR1):\n%s", len(tasks), out.getvalue())


def install(loop: asyncio.AbstractEventLoop) -> None:
    loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
