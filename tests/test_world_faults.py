"""The world's faults under one real `steward run`, nobody stepping in: the chaos test's
workload (Slack in HTTP mode through the fake Slack, mail through Dovecot and an SMTP sink,
a model that streams and calls a tool; tests/test_chaos.py), but instead of killing
Steward the test breaks what Steward depends on:

* its PostgreSQL server — a server of the test's own (tests/fakes/pg_cluster.py) — is
  restarted again and again during turns, `-m fast` (as a package upgrade does) and
  `-m immediate` (as a crash does), down for up to a few seconds each time;
* the disk under its SQLite home — a small tmpfs of the test's own — fills up for a while
  and then has space again.

Counted from what the fake Slack server and the SMTP sink received (never from Steward's
database): every due message answered exactly once, in its place (`tally`). And the one
process lived through it all (no restart, exit 0 at SIGTERM), said so in a handful of log
lines rather than a traceback per attempt, and wrote its health (`health.json`) showing the
outages it waited out.

    STEWARD_FAULT_SEED=123   replay a seed (else a random one, always printed)
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest

from tests.fakes.chaos_sender import SlackSender
from tests.fakes.chaos_servers import ChaosSink, ChaosSlack
from tests.fakes.chaos_steward import Steward
from tests.fakes.llm_server import FakeLLMServer
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
)
from tests.fakes.pg_cluster import pg_fixture  # noqa: F401 - a fixture
from tests.fakes.slack_rig import free_port
from tests.fakes.small_disk import fill, mounted
from tests.test_chaos import (
    ALICE,
    BOB,
    EVE,
    Model,
    SentAgain,
    Workload,
    cut_off,
    environment,
    plan,
    quiesce,
    received,
    satisfied,
    sent_folder,
    tally,
    write_config,
)


def fault_seed() -> int:
    return int(os.environ.get("STEWARD_FAULT_SEED") or random.SystemRandom().randrange(10**6))


class _NoKiller:
    """The workload's hook for activity: nothing is killed here."""

    def trip(self, kind: str) -> None:
        pass


class _LogsElsewhere(Steward):
    """A `steward run` whose logs are kept off its home (the home's disk is the one that
    fills up; a service's log goes to the journal, not there)."""

    def __init__(self, *args, logs: Path, **kw):
        super().__init__(*args, **kw)
        self.logs = logs

    def log_path(self, run: int) -> Path:
        return self.logs / f"run{run:03d}.log"


async def under_faults(home: Path, store_url: str, account, breaker, *, messages: int,
                       seed: int, budget: float, logs: Path | None = None) -> tuple:
    """Run the workload while `breaker(steward)` breaks the world; return (steward, tally,
    the log's text)."""
    rng = random.Random(f"{seed}:plan")
    msgs = plan(rng, messages, gap=0.45)
    convs = {m.token: m.conv for m in msgs}
    logs = logs or home
    again = SentAgain(logs)
    with ChaosSlack() as slack, FakeLLMServer() as llm:
        for user, name in ((ALICE, "Alice"), (BOB, "Bob"), (EVE, "Eve")):
            slack.add_user(user, name)
        sink = await ChaosSink().start()
        port = free_port()
        write_config(home, store_url, llm, slack, port, account, sink)
        steward = _LogsElsewhere(home, environment(home, account), port, logs=logs)
        killer = _NoKiller()
        sender = SlackSender(f"http://127.0.0.1:{port}/slack/events",
                             random.Random(f"{seed}:send"), on_ack=lambda: None)
        llm.responder = Model(convs, killer.trip)
        workload = Workload(msgs, seed, slack, sink, account, sender, steward, killer,
                            random.Random(f"{seed}:mail"))
        tasks: list[asyncio.Task] = []
        try:
            async with asyncio.timeout(budget):
                await steward.start()
                assert await steward.ready(), steward.tail()
                tasks = [asyncio.create_task(sender.run()),
                         asyncio.create_task(workload.run()),
                         asyncio.create_task(breaker(steward))]
                await asyncio.gather(*tasks)
                settled = await quiesce(steward, slack, sink, llm, sender,
                                        lambda: satisfied(msgs, slack, sink),
                                        quiet=4.0, give_up=40.0)
                health_file = home / "health.json"
                health = json.loads(health_file.read_text()) if health_file.exists() else {}
                code = await steward.terminate()
        except TimeoutError:
            pytest.fail(f"faults: the test's own timeout ({budget:.0f} s), seed {seed}\n"
                        + steward.tail(), pytrace=False)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await steward.stop_quietly()
            await sink.stop()
    answers, refusals = received(slack, sink)
    t = tally(msgs, answers, refusals, await sent_folder(account), cut_off(sink), again())
    log = steward.log_path(0).read_text(errors="replace")
    line = (f"messages={sum(m.sent_at is not None for m in msgs)} lost={len(t.lost)} "
            f"duplicate={len(t.duplicate)} wrong={len(t.wrong)} (seed {seed}); in doubt "
            f"{len(t.in_doubt)}; settled {settled}")
    print(line)
    problems = "\n".join([*t.lost, *t.duplicate, *t.wrong])
    assert steward.runs == 1 and not steward.crashes, f"{line}\n{steward.tail()}"
    assert code == 0, f"{line}\nSIGTERM: exit {code}\n{steward.tail()}"
    assert t.clean, f"{line}\n{problems}\n{steward.tail()}"
    assert health and health["connected"] == {"slack": True, "email": True}, health
    return steward, t, log, health


def _lines(log: str, needle: str) -> int:
    return sum(needle in line for line in log.splitlines())


# -- PostgreSQL restarting -----------------------------------------------------------------


async def test_postgres_restarting_under_load_loses_nothing(pg, tmp_path, account):
    seed = fault_seed()
    rng = random.Random(f"{seed}:pg")
    modes = ["fast", "immediate", "fast", "immediate", "fast"]
    downs: list[str] = []

    async def restart_again_and_again(steward):
        await asyncio.sleep(rng.uniform(2.0, 4.0))
        for mode in modes:
            down = rng.uniform(0.0, 3.0)
            await pg.restart(mode, down=down)
            downs.append(f"{mode} {down:.1f}s")
            assert steward.alive, steward.tail()
            await asyncio.sleep(rng.uniform(1.5, 4.0))

    print(f"faults: seed {seed}, postgres on port {pg.port}")
    steward, _, log, health = await under_faults(
        tmp_path / "home", pg.url, account, restart_again_and_again, messages=40, seed=seed,
        budget=420)
    print("restarts:", ", ".join(downs))
    # Said once when it started and once when it ended, per loop that met it; no traceback
    # per attempt.
    waits = _lines(log, "the store is unavailable")
    assert 1 <= waits <= len(modes) * 6, log[-6000:]
    assert _lines(log, "Traceback") <= len(modes) * 3, log[-6000:]
    assert health and health["loops"]["runner"]["state"] == "ok"


# -- the disk filling up -----------------------------------------------------------------


@pytest.fixture
def small_disk():
    """A 48 MB tmpfs of the test's own: room for the home, not for a ballast as well."""
    with mounted("48m") as disk:
        yield disk


async def test_a_full_disk_for_a_while_loses_nothing(small_disk, tmp_path, account):
    seed = fault_seed()
    rng = random.Random(f"{seed}:disk")
    held = float(os.environ.get("STEWARD_FULL_SECONDS") or 20.0)
    spans: list[str] = []

    async def fill_then_free(steward):
        await asyncio.sleep(rng.uniform(3.0, 5.0))
        ballast = await asyncio.to_thread(fill, small_disk)
        began = time.monotonic()
        free = shutil.disk_usage(small_disk).free
        await asyncio.sleep(held)
        assert steward.alive, steward.tail()
        await asyncio.to_thread(ballast.unlink)
        spans.append(f"full ({free} bytes free) for {time.monotonic() - began:.1f}s")

    home = small_disk / "home"
    print(f"faults: seed {seed}, home on a tmpfs at {small_disk}")
    steward, _, log, health = await under_faults(
        home, f"sqlite+aiosqlite:///{home / 'steward.db'}", account, fill_then_free,
        messages=40, seed=seed, budget=420, logs=tmp_path)
    print("disk:", ", ".join(spans))
    # Steward met the full disk: the Slack journal appends with every event; SQLite only
    # when its WAL must grow (it reuses the space a checkpoint freed), which depends on
    # timing.
    met = _lines(log, "the store is unavailable") + _lines(log, "could not be journaled")
    assert met >= 1, log[-6000:]
    assert _lines(log, "Traceback") <= 10, log[-6000:]
    # Whichever loops met the full disk (the runner's claims, its commits, the scheduler;
    # Slack's and the mail's intake log it), each is back to work.
    assert {h["state"] for h in health["loops"].values()} == {"ok"}, health
