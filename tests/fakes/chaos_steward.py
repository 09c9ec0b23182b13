"""A real `steward run` subprocess for the chaos test, and the killer that SIGKILLs it.

`Steward`: one process at a time in a home directory, each run logging to
`run<NNN>.log` there (`-v`); killed and terminated by its own pid only. `sigkill` may be
called from any thread (the fake servers' hooks call it synchronously, so the kill lands
before the server's answer reaches Steward).

`Killer`: kills the running process at a random instant, during its start-up (while it
resumes), or right after activity (`trip(kind)` from the test's sources: an event acked,
a message posted or edited in Slack, an SMTP stage, a request at the LLM, a mail appended;
armed for one kind per cycle, and by chance for some others, see CHANCES), sometimes in
bursts (right after the first LLM request, several times running, so that the same piece
of work is cut off again and again); then starts it again, at once or after a short
random delay, now and then with an internal kill point (`STEWARD_KILL_AT`) armed as well.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

# Kinds of activity the killer can be armed for ("any" matches each of them).
ACTIVITY = ("ack", "slack-post", "slack-update", "smtp-rcpt", "smtp-noop", "smtp-data", "llm",
            "mail-append")
ARMINGS = [("ack",), ("slack-post",), ("slack-update",), ("slack-post", "slack-update"),
           ("smtp-rcpt",), ("smtp-noop",), ("smtp-noop",), ("smtp-data",), ("llm",),
           ("mail-append",), ("any",)]
# Besides the armed kind, each occurrence of these kills with this chance while the killer
# runs: the narrow windows get hit often enough (NOOP: the reply is in Sent, DATA not sent).
CHANCES = {"smtp-noop": 0.3, "smtp-rcpt": 0.05, "smtp-data": 0.05, "slack-post": 0.03,
           "mail-append": 0.03}
# Internal kill points (the process kills itself the first time it gets there).
KILL_POINTS = ["slack-acked:slack", "slack-posted:slack", "slack-stream-updated:slack",
               "slack-sent:slack", "mid-stream:llm_call", "after-result:llm_call",
               "after-effect:tool_call", "after-phase:turn.after_llm",
               "after-phase:turn.delivered", "after-intent:deliver", "after-effect:deliver",
               "email-fetched:email", "smtp-connected:email", "smtp-journaled:email",
               "smtp-sent:email",
               "sent-appended:email"]


NOISE = ("INFO httpx:", "INFO aioimaplib.")  # after the log line's timestamp


class Steward:
    def __init__(self, home: Path, env: dict[str, str], port: int):
        self.home = home
        self.env = env
        self.port = port
        self.proc: asyncio.subprocess.Process | None = None
        self.runs = 0
        self.kills = 0  # SIGKILLs sent by the test
        self.self_kills = 0  # runs that killed themselves at an internal kill point
        self.crashes: list[str] = []  # runs that ended any other way (a failure)
        self.history: list[str] = []
        self.kill_at: str | None = None
        self._killed = False
        self._why = ""
        self._started = 0.0
        self._lock = threading.Lock()

    @property
    def deaths(self) -> int:
        return self.kills + self.self_kills

    @property
    def alive(self) -> bool:
        proc = self.proc
        return proc is not None and proc.returncode is None

    @property
    def killed(self) -> bool:
        return self._killed

    def log_path(self, run: int) -> Path:
        return self.home / f"run{run:03d}.log"

    async def start(self, kill_at: str | None = None) -> None:
        assert not self.alive
        env = dict(self.env)
        if kill_at:
            env["STEWARD_KILL_AT"] = kill_at
        log = open(self.log_path(self.runs), "wb")  # noqa: ASYNC230, SIM115 - a child's log
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "-v", "run", env=env, cwd=self.home,
                stdout=log, stderr=asyncio.subprocess.STDOUT)
        finally:
            log.close()
        with self._lock:
            self.proc = proc
            self.runs += 1
            self.kill_at = kill_at
            self._killed = False
            self._why = ""
            self._started = time.monotonic()

    def sigkill(self, why: str) -> bool:
        """SIGKILL the running process (any thread); False if there is none to kill."""
        with self._lock:
            proc = self.proc
            if proc is None or proc.returncode is not None or self._killed:
                return False
            try:
                os.kill(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                return False
            self._killed = True
            self._why = f"{why} at {time.monotonic() - self._started:.2f}s"
            self.kills += 1
            return True

    async def ended(self, within: float = 30.0) -> int:
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), within)
        run = self.runs - 1
        armed = f" (kill point {self.kill_at})" if self.kill_at else ""
        if self._killed:
            self.history.append(f"run {run}{armed}: killed {self._why}")
        elif code == -signal.SIGKILL and self.kill_at:
            self.self_kills += 1
            self.history.append(f"run {run}: killed itself at {self.kill_at} after "
                                f"{time.monotonic() - self._started:.2f}s")
        else:
            self.crashes.append(f"run {run}{armed} exited with {code}")
            self.history.append(self.crashes[-1])
        return code

    async def ready(self, within: float = 60.0) -> bool:
        """Wait until it serves the Events API port; False if it died first."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if not self.alive:
                return False
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                await writer.wait_closed()
                return True
            except OSError:
                await asyncio.sleep(0.03)
        raise AssertionError(f"steward did not serve port {self.port} in {within} s:\n"
                             + self.tail())

    async def terminate(self, within: float = 60.0) -> int:
        assert self.proc is not None
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            self.sigkill("SIGTERM did not stop it")
            await self.proc.wait()
            raise AssertionError(f"steward did not stop in {within} s:\n{self.tail()}") \
                from None

    async def stop_quietly(self) -> None:
        """At the end of a failed test: leave nothing running."""
        if self.alive:
            self.sigkill("the test is over")
            assert self.proc is not None
            await self.proc.wait()

    def tail(self, runs: int = 2, chars: int = 6000) -> str:
        parts = []
        for run in range(max(0, self.runs - runs), self.runs):
            path = self.log_path(run)
            if path.exists():  # without the per-request chatter of httpx and aioimaplib
                lines = [line for line in path.read_text(errors="replace").splitlines()
                         if not line.startswith(NOISE, 24)]
                parts.append(f"--- {path.name} ---\n" + "\n".join(lines)[-chars:])
        return "\n".join(parts)


@dataclass
class Killer:
    steward: Steward
    rng: random.Random
    restart_kill_points: float = 0.15  # share of starts with an internal kill point armed
    burst_chance: float = 0.15
    chances: dict[str, float] = field(default_factory=lambda: dict(CHANCES))
    active: bool = False  # killing (opportunistic kills only then)
    burst_length: tuple[int, int] = (5, 7)
    log: list[str] = field(default_factory=list)
    _armed: frozenset = frozenset()
    _delay: float = 0.0
    _tripped: float | None = None
    _why: str = ""
    _burst: int = 0
    _since_burst: int = 3  # cycles since the last burst (none before the first)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _chance: random.Random = field(default_factory=random.Random)

    def trip(self, kind: str) -> None:
        """Activity happened (any thread). Armed for it: kill now, or after the delay."""
        with self._lock:
            if not self._armed or not (kind in self._armed or "any" in self._armed):
                if self.active and self._chance.random() < self.chances.get(kind, 0.0):
                    self.steward.sigkill(f"right after {kind} (by chance)")
                return
            if self._delay <= 0:
                self._armed = frozenset()
                self.steward.sigkill(f"right after {kind}")
            elif self._tripped is None:
                self._tripped = time.monotonic()
                self._why = kind

    def _arm(self, kinds: tuple[str, ...], delay: float) -> None:
        with self._lock:
            self._armed, self._delay, self._tripped = frozenset(kinds), delay, None

    def _disarm(self) -> None:
        with self._lock:
            self._armed, self._tripped = frozenset(), None

    async def start(self, *, points: bool = True) -> None:
        point = None
        if points and self.rng.random() < self.restart_kill_points:
            point = self.rng.choice(KILL_POINTS)
        await self.steward.start(kill_at=point)

    async def run(self, kills: int) -> None:
        """Kill (self-kills included) `kills` times, starting it again each time. Returns
        with the process running."""
        self._chance.seed(self.rng.random())
        self.active = True
        try:
            while self.steward.deaths < kills:
                await self._cycle()
                await self.steward.ended()
                last = self.steward.deaths >= kills
                if last:
                    self.active = False
                if self.rng.random() < 0.5:
                    await asyncio.sleep(self.rng.uniform(0.05, 2.5))
                await self.start(points=not last)  # the last run is left alone
        finally:
            self.active = False

    async def _wait(self, seconds: float) -> bool:
        """Sleep, unless it dies first; True if it is still alive."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not self.steward.alive or self.steward.killed:
                return False
            await asyncio.sleep(0.01)
        return True

    async def _cycle(self) -> None:
        steward, rng = self.steward, self.rng
        self._since_burst += 1
        if self._burst == 0 and self._since_burst > 3 and rng.random() < self.burst_chance:
            self._burst = rng.randint(*self.burst_length)
        if self._burst:
            self._burst -= 1
            self._since_burst = 0
            mode = "burst"
        else:
            mode = rng.choices(["startup", "random", "activity"], [0.12, 0.4, 0.48])[0]
        if mode == "startup":
            if await self._wait(rng.uniform(0.05, 1.6)):
                steward.sigkill("during start-up")
            return
        if not await steward.ready():
            return
        if mode == "random":
            if await self._wait(rng.uniform(0.2, 4.0)):
                steward.sigkill("at a random instant")
            return
        kinds = ("llm",) if mode == "burst" else rng.choice(ARMINGS)
        delay = 0.0 if mode == "burst" or rng.random() < 0.6 else rng.uniform(0.0, 0.3)
        fallback = rng.uniform(1.5, 6.0)
        self._arm(kinds, delay)
        try:
            deadline = time.monotonic() + fallback
            while time.monotonic() < deadline:
                if not steward.alive or steward.killed:
                    return
                tripped = self._tripped
                if tripped is not None and time.monotonic() - tripped >= self._delay:
                    steward.sigkill(f"{self._delay:.2f}s after {self._why}")
                    return
                await asyncio.sleep(0.005)
            steward.sigkill(f"after waiting {fallback:.1f}s for {'/'.join(kinds)}")
        finally:
            self._disarm()
