"""Several `steward run` workers on one PostgreSQL store, each a real process with its own
home directory, Slack in HTTP mode (events spread over the workers, as a load balancer
would), the fake Slack, Dovecot + an SMTP sink and a slowly streaming fake LLM. Workers are
SIGKILLed and not restarted; what the people see is counted exactly: every acknowledged
message answered once, in its one message; one worker watches the mailbox and fires
schedules at a time, and another takes over when it dies."""

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.fakes.mail_rig import email_toml, mail
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)
from tests.fakes.slack_events import deliver, says
from tests.fakes.slack_rig import ENV, free_port
from tests.fakes.slack_server import FakeSlack

pytestmark = pytest.mark.parametrize("store_url", ["postgres"], indirect=True)

ALICE = "U0ALICE"
ANSWER = "Noted. Here is what I would do about it, step by step, in a few short lines."


@pytest.fixture
def llm():
    reply = Reply(text=ANSWER, chunk_chars=6, delay=0.02)
    with FakeLLMServer(lambda _request, _wire: reply) as server:
        yield server


@pytest.fixture
def slack():
    with FakeSlack() as fake:
        fake.add_user(ALICE, "Alice")
        yield fake


class Worker:
    def __init__(self, root: Path, n: int, store_url: str, llm, slack, *, email=None):
        self.home = root / f"worker{n}"
        self.home.mkdir(parents=True)
        self.port = free_port()
        self.log = self.home / "run.log"
        self.proc: asyncio.subprocess.Process | None = None
        email_section = "" if email is None else email_toml(*email)
        (self.home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "openai"
base_url = "{llm.url}/v1"
model = "fake-model"
[slack]
enabled = true
mode = "http"
http_port = {self.port}
api_base_url = "{slack.url}"
allowed_users = ["{ALICE}"]
stream_update_seconds = 0.15
takeover_seconds = 2.0
{email_section}
[runtime]
concurrency = 4
lease_seconds = 3.0
retry_base_seconds = 0.05
retry_max_seconds = 0.2
drain_seconds = 5.0
""")

    async def start(self, kill_at: str | None = None, password: str | None = None) -> None:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_", "SLACK_"))}
        env.update(ENV, STEWARD_HOME=str(self.home),
                   STEWARD_CONFIG=str(self.home / "config.toml"))
        if password:
            env["STEWARD_IMAP_PASSWORD"] = password
        if kill_at:
            env["STEWARD_KILL_AT"] = kill_at
        with open(self.log, "wb") as out:  # noqa: ASYNC230 - the child's log file
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bot", "-v", "run", env=env, cwd=self.home,
                stdout=out, stderr=asyncio.subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise AssertionError(self.tail())
            if await self.ready():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"worker did not start serving:\n{self.tail()}")

    async def ready(self) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        writer.close()
        await writer.wait_closed()
        return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/slack/events"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    async def stop(self) -> int | None:
        if not self.alive:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            # Where it waits goes to its log first (bot/app/taskdump.py), for the failure.
            self.proc.send_signal(signal.SIGUSR1)
            await asyncio.sleep(2.0)
            self.proc.kill()
            await self.proc.wait()
            return None

    async def kill(self) -> None:
        if self.alive:
            self.proc.kill()
            await self.proc.wait()


async def until(check, within: float, what: str, workers=()):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.1)
    logs = "\n".join(f"--- {w.home.name}\n{w.tail()}" for w in workers)
    raise AssertionError(f"timed out waiting for {what}\n{logs}")


def answered(slack, dms: list[str]) -> dict[str, list[str]]:
    return {dm: [m["text"] for m in slack.bot_messages(dm)] for dm in dms}


async def test_three_workers_two_killed_mid_turn_and_mid_delivery_answer_each_once(
        store_url, tmp_path, llm, slack):
    workers = [Worker(tmp_path, n, store_url, llm, slack) for n in range(3)]
    try:
        # One dies between its first LLM result and the post; one while posting an answer.
        await workers[0].start(kill_at="after-result:llm_call")
        await workers[1].start(kill_at="slack-posted")
        await workers[2].start()
        dms = [f"D0P{n:02d}" for n in range(30)]
        async with httpx.AsyncClient(timeout=20) as http:
            for n, dm in enumerate(dms):
                _, body = says(slack, dm, ALICE, f"question {n}")
                target = workers[n % 3]
                status = 0
                for w in (target, *workers):  # a dead worker: the balancer tries another
                    if w.alive:
                        try:
                            status, _ = await deliver(http, w.url, body)
                            break
                        except httpx.TransportError:
                            continue
                assert status == 200  # acknowledged: from here on it must be answered once
                await asyncio.sleep(0.05)
        await until(lambda: not workers[0].alive and not workers[1].alive, 60,
                    "both kill points to be reached", workers)
        await until(lambda: all(ANSWER in t for texts in answered(slack, dms).values()
                                for t in texts) and all(answered(slack, dms).values()),
                    90, "every message answered", workers)
        await asyncio.sleep(2.0)  # anything answered twice would show now
        seen = answered(slack, dms)
        assert {dm: len(texts) for dm, texts in seen.items() if len(texts) != 1} == {}
        assert all(texts == [ANSWER] for texts in seen.values()), seen
    finally:
        for w in workers:
            await w.kill() if w is not workers[2] else None
        code = await workers[2].stop()
    assert code == 0, workers[2].tail()


async def test_an_event_acked_by_a_worker_that_died_is_answered_by_another(
        store_url, tmp_path, llm, slack, account, sink):
    """The worker acks and dies before storing anything: the event is in the shared store,
    and the other worker takes it in. The mailbox has one watcher, the first worker; when
    it dies the other takes the mailbox over."""
    first, second = (Worker(tmp_path, n, store_url, llm, slack, email=(account, sink))
                     for n in range(2))
    try:
        await first.start(kill_at="slack-acked", password=account.password)
        await until(lambda: "leading " in first.tail(20000) and "email:" in first.tail(20000),
                    30, "the first worker to watch the mailbox", [first])
        await second.start(password=account.password)
        await account.append(mail(message_id="m1@example.com", subject="One"))
        await sink.wait_for(1, seconds=30)
        async with httpx.AsyncClient(timeout=20) as http:
            _, body = says(slack, "D0ACKED", ALICE, "are you there?")
            status, _ = await deliver(http, first.url, body)
        assert status == 200
        await until(lambda: not first.alive, 30, "the first worker to die after its ack")
        await account.append(mail(message_id="m2@example.com", subject="Two"))
        await until(lambda: answered(slack, ["D0ACKED"])["D0ACKED"], 60,
                    "the acked event to be answered", [first, second])
        await sink.wait_for(2, seconds=60)
        await asyncio.sleep(2.0)
        assert answered(slack, ["D0ACKED"]) == {"D0ACKED": [ANSWER]}
        assert sorted(m.message["In-Reply-To"] for m in sink.messages) == [
            "<m1@example.com>", "<m2@example.com>"]
        # Only one worker watched at a time: the second began after the first died.
        assert "email: watching INBOX" not in second.tail(200000).split("leading ")[0]
        assert "acknowledged events another worker did not finish" in second.tail(200000)
    finally:
        await first.kill()
        code = await second.stop()
    assert code == 0, second.tail()


async def test_one_leader_at_a_time_and_the_next_when_it_goes(store_url):
    from sqlalchemy import text

    from store import open_store

    a, b = await open_store(store_url), await open_store(store_url)
    stop = asyncio.Event()
    first, second = a.leader("job", poll_seconds=0.1), b.leader("job", poll_seconds=0.1)
    other = b.leader("another job")
    try:
        assert await first.acquire(stop) and first.leading
        waiting = asyncio.create_task(second.acquire(stop))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # one at a time
        assert await other.acquire(stop)  # each job its own lead
        # The leader's connection dies (the server restarted, the network broke): it
        # learns it has lost the lead, and the other takes over. The holder is found by its
        # lock, not through its connection, which its own check is using meanwhile.
        async with b.engines.write.connect() as conn:
            key = first.key & 0xFFFF_FFFF_FFFF_FFFF  # its two 32-bit halves
            pid = (await conn.execute(text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND objsubid = 1 AND classid::bigint = :hi AND objid::bigint = :lo"),
                {"hi": key >> 32, "lo": key & 0xFFFF_FFFF})).scalar_one()
            assert (await conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
                    ).scalar()
        await asyncio.wait_for(first.lost.wait(), 60)
        assert not first.leading
        assert await asyncio.wait_for(waiting, 60) and second.leading
    finally:
        stop.set()
        for leader in (first, second, other):
            await leader.release()
        await a.close()
        await b.close()
