"""Backups on a schedule while `steward run` serves, and what `steward doctor` says of them.

The schedule keeps no state of its own: the loop looks at the newest good backup in the
directory (its manifest's `taken_at`) when it starts and every few minutes after, and
takes one when that is `[backup] every` old. A restart therefore neither repeats a backup
nor forgets one. A failed attempt is noted in the directory (bot/app/backup.py `FAILED`)
and tried again after `RETRY_SECONDS` (a process that keeps restarting does not keep
starting backups either); it never stops the loop, nor the process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from bot.app.backup import last_failure, newest_backup, parse_time, take_backup
from bot.app.backup_config import backup_dir

log = logging.getLogger(__name__)

START_DELAY = 5.0  # seconds after the start: the resumed work first
CHECK_SECONDS = 300.0
RETRY_SECONDS = 900.0


def due_in(where: Path, every: float, now: float) -> float:
    """Seconds until the next backup is due in `where` (<= 0: now). Blocking."""
    due = now
    newest = newest_backup(where)
    if newest is not None:
        due = parse_time(newest[1]["taken_at"]) + every
    failed = last_failure(where)
    if failed is not None:
        try:
            due = max(due, parse_time(failed["at"]) + min(every, RETRY_SECONDS))
        except (TypeError, ValueError):
            pass
    return due - now


async def keep_backing_up(config, health=None, *, start_delay: float = START_DELAY,
                          check_seconds: float = CHECK_SECONDS) -> None:
    """Take a backup whenever the newest is `[backup] every` old, until cancelled."""
    every = config.backup.every_seconds
    where = backup_dir(config)
    check = min(check_seconds, max(1.0, every / 10))
    await asyncio.sleep(start_delay)
    while True:
        wait = await asyncio.to_thread(due_in, where, every, time.time())
        if wait <= 0:
            try:
                made = await take_backup(config)
                log.info("backup %s taken in %.1f s", made.path, made.seconds)
            except Exception as exc:  # noqa: BLE001 - noted, retried; the process goes on
                log.error("the scheduled backup into %s failed (tried again in %.0f min): %s",
                          where, min(every, RETRY_SECONDS) / 60, exc)
                await asyncio.sleep(check)  # the note it left says when to try again
            continue
        if health is not None:
            health.progressed()
        await asyncio.sleep(min(check, wait))


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}" if unit != "min" else f"{seconds / 60:.0f} min"
    return f"{max(seconds, 0):.0f} s"


def backup_status(config, now: float) -> tuple[str, str, str]:
    """Doctor's row: (ok|warn, detail, fix). Blocking (reads the directory)."""
    from bot.app.verdicts import OK, WARN

    section = config.backup
    every = section.every_seconds
    where = backup_dir(config)
    configured = every is not None or bool(section.dir)
    newest = newest_backup(where)
    failed = last_failure(where)
    take = "`steward backup` takes one now"
    if failed is not None:
        note = f"the last attempt ({failed.get('at')}) failed: {failed.get('error')}"
        return WARN, note, f"fix that, then {take}"
    if newest is None:
        if not configured:
            return OK, (f"no backup in {where} yet; {take}; [backup] every = \"1d\" has "
                        "`steward run` take them"), ""
        return WARN, f"no backup in {where} yet", take
    path, manifest = newest
    age = now - parse_time(manifest["taken_at"])
    detail = f"last good backup {_age(age)} ago: {path}"
    if every is not None and age > 2 * every:
        return WARN, f"{detail}, more than twice [backup] every ({_age(every)}) ago", \
            f"is `steward run` running? ({take})"
    if every is None:
        detail += " (not scheduled: [backup] every)"
    return OK, detail, ""


async def backup_check(ctx):
    """`steward doctor`'s row: the age of the last good backup."""
    from bot.app.verdicts import SKIP

    if ctx.config is None:
        return SKIP, "the config did not load", ""
    return await asyncio.to_thread(backup_status, ctx.config, time.time())
