"""Long-lived loops that ride out the store's outages, and say how they are doing.

A loop (the runner's claims, the scheduler's passes) that meets the store's outage — the
database restarting, its connection gone, the disk under SQLite full (`store.is_unavailable`)
— waits it out: it logs once when the outage starts and once when it ends, tries again with
a backoff capped at `MAX_BACKOFF`, and goes on by itself when the store answers. Any other
error ends the loop, and with it the process (`steward run` exits non-zero, so the service
manager starts a fresh one): a process that is up but not working must not exist.

`Health` holds each loop's state and last progress. `steward run` writes it to the home
(`health.json`, replaced atomically every few seconds) for `steward doctor` and the
inspector, and the runner's own loop is the heartbeat the service manager's watchdog hears
(`on_beat`): when that loop stops turning, whatever the reason, the pings stop.
"""

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

from bot.home import write_private
from store import is_unavailable

log = logging.getLogger(__name__)

FIRST_BACKOFF = 0.25  # seconds before the first retry, doubled up to MAX_BACKOFF
MAX_BACKOFF = 5.0
HEALTH_FILE = "health.json"
PUBLISH_SECONDS = 2.0


class LoopHealth:
    """One loop's health: `progressed()` after each turn of it, `wait_out(exc)` when a turn
    failed."""

    def __init__(self, name: str, *, on_beat: Callable[[], None] | None = None,
                 give_up_after: float | None = None):
        self.name = name
        self.on_beat = on_beat
        self.give_up_after = give_up_after  # seconds of outage before it is raised
        self.last_progress = time.time()
        self.outage_since: float | None = None  # time.time() of the first failed turn
        self.error: str | None = None
        self.outages = 0  # outages waited out, since the start
        self._backoff = FIRST_BACKOFF

    @property
    def waiting(self) -> bool:
        return self.outage_since is not None

    def progressed(self) -> None:
        self.last_progress = time.time()
        if self.outage_since is not None:
            log.warning("%s: the store is back after %.1f s; carrying on", self.name,
                        self.last_progress - self.outage_since)
            self.outage_since, self.error, self._backoff = None, None, FIRST_BACKOFF
        if self.on_beat is not None:
            self.on_beat()

    async def wait_out(self, exc: BaseException, wake: asyncio.Event | None = None) -> None:
        """After a failed turn of the loop: if `exc` is the store's outage, wait a while
        (less if `wake` is set) and return so the loop tries again; raise anything else, and
        an outage longer than `give_up_after`."""
        if not is_unavailable(exc):
            raise exc
        now = time.time()
        if self.outage_since is None:
            self.outage_since, self.outages = now, self.outages + 1
            log.warning("%s: the store is unavailable (%s); waiting for it", self.name,
                        describe(exc))
        self.error = describe(exc)
        if self.give_up_after is not None and now - self.outage_since > self.give_up_after:
            raise exc
        if self.on_beat is not None:  # waiting on purpose is working: a restart won't help
            self.on_beat()
        delay, self._backoff = self._backoff, min(MAX_BACKOFF, self._backoff * 2)
        delay *= random.uniform(0.75, 1.0)
        if wake is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), delay)

    def snapshot(self) -> dict:
        return {"state": "waiting for the store" if self.waiting else "ok",
                "last_progress": round(self.last_progress, 3),
                "outage_since": self.outage_since, "error": self.error,
                "outages": self.outages}


def describe(exc: BaseException) -> str:
    """One line: the innermost cause that says something, e.g. 'OperationalError:
    database or disk is full'."""
    inner = exc
    for _ in range(5):
        nxt = getattr(inner, "orig", None) or inner.__cause__
        if not isinstance(nxt, BaseException):
            break
        inner = nxt
    text = " ".join(str(inner).split())[:200]
    return f"{type(inner).__name__}: {text}" if text else type(inner).__name__


class Health:
    """The loops of one process; `publish` keeps `home/health.json` up to date."""

    def __init__(self, home: Path | None = None):
        self.path = None if home is None else home / HEALTH_FILE
        self.loops: dict[str, LoopHealth] = {}
        self.started_at = time.time()
        # name -> whether it is connected now (the connectors' `up`), read at each write
        self.connected: dict[str, Callable[[], bool]] = {}

    def loop(self, name: str, **kw) -> LoopHealth:
        self.loops[name] = LoopHealth(name, **kw)
        return self.loops[name]

    def snapshot(self) -> dict:
        return {"pid": os.getpid(), "started_at": round(self.started_at, 3),
                "updated_at": round(time.time(), 3),
                "loops": {name: h.snapshot() for name, h in self.loops.items()},
                "connected": {name: bool(up()) for name, up in self.connected.items()}}

    async def publish(self, every: float = PUBLISH_SECONDS) -> None:
        """Write the snapshot every `every` seconds, until cancelled. A write that fails
        (the disk is full too) is skipped: the next one tries again."""
        assert self.path is not None
        while True:
            try:
                await asyncio.to_thread(write_private, self.path, json.dumps(self.snapshot()))
            except OSError as exc:
                log.debug("health: not written: %s", exc)
            await asyncio.sleep(every)

    def remove(self) -> None:
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()


def read_health(home: Path) -> dict | None:
    """What the last `steward run` on this home wrote, or None."""
    try:
        return json.loads((home / HEALTH_FILE).read_text())
    except (OSError, ValueError):
        return None
