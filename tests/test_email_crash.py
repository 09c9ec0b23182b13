"""Kill a real `steward run` (email enabled, Dovecot + aiosmtpd, the fake LLM server) at the
dangerous points of taking and answering mail, start it again, and count at the SMTP
server: every allowed mail has exactly one reply, correctly threaded; mail that arrived
while Steward was down is answered too; nothing is left flagged as being sent."""

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from connectors.email.channel import QUEUED, SENDING
from tests.fakes.llm_server import FakeLLMServer, Reply, replies
from tests.fakes.mail_rig import ADDRESS, ALLOWED, email_toml, mail
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)

POINTS = [
    "email-fetched:email",  # fetched, not committed: taken again
    "after-result:llm_call",  # during the turn
    "smtp-connected:email",  # during the SMTP send, before DATA: nothing went out
    "smtp-journaled:email",  # the Sent copy is there, DATA has not begun: not sent
    "smtp-data:email",  # DATA's 354 is in, no line is sent: not sent
    "smtp-before-dot:email",  # DATA's lines are sent, the final dot is not: not sent
    # (the dot written, its Sent copy not marked: tests/test_email_send_window.py)
    "smtp-marked:email",  # the dot is written and its copy marked, the answer unread: sent
    "smtp-sent:email",  # the send returned, the Sent copy is not final yet
    "sent-appended:email",  # the Sent copy is final, the delivery result is not stored
]


# Every point on SQLite; on PostgreSQL the in-doubt send by default, all of them with -m slow.
PG_DEFAULT = {"smtp-sent:email", "smtp-journaled:email", "smtp-data:email"}
CASES = [pytest.param("sqlite", p, id=f"sqlite-{p}") for p in POINTS] + [
    pytest.param("postgres", p, id=f"postgres-{p}",
                 marks=() if p in PG_DEFAULT else pytest.mark.slow) for p in POINTS]


@pytest.fixture
def llm():
    with FakeLLMServer(replies(Reply(text="Done, as you asked."))) as server:
        yield server


def make_home(tmp_path: Path, store_url: str, llm_url: str, account, sink) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "openai"
base_url = "{llm_url}/v1"
model = "fake-model"
{email_toml(account, sink)}[runtime]
concurrency = 2
lease_seconds = 2.0
retry_base_seconds = 0.05
retry_max_seconds = 0.1
drain_seconds = 5.0
""")
    return home


async def start(home: Path, account, kill_at: str | None = None, run: int = 0):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), STEWARD_CONFIG=str(home / "config.toml"),
               STEWARD_IMAP_PASSWORD=account.password)
    if kill_at:
        env["STEWARD_KILL_AT"] = kill_at
    log = open(home / f"run{run}.log", "wb")  # noqa: ASYNC230, SIM115 - a child's log file
    try:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", "-v", "run", env=env, cwd=home, stdout=log,
            stderr=asyncio.subprocess.STDOUT)
    finally:
        log.close()


def logs(home: Path, tail: int = 4000) -> str:
    return "\n".join(p.read_text(errors="replace")[-tail:] for p in sorted(home.glob("run*.log")))


async def ended(proc, home: Path, seconds: float = 60.0) -> int:
    try:
        return await asyncio.wait_for(proc.wait(), seconds)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"steward did not stop in {seconds} s:\n{logs(home)}")


@pytest.mark.parametrize(("store_url", "point"), CASES, indirect=["store_url"])
async def test_every_allowed_mail_is_answered_once_after_sigkill(
        store_url, tmp_path, account, sink, llm, point):
    home = make_home(tmp_path, store_url, llm.url, account, sink)
    await account.append(mail(message_id="one@example.com", subject="First task"))
    await account.append(mail(sender="eve@example.net", message_id="eve@example.net"))
    await account.append(mail(message_id="auto@example.com", subject="Out of office",
                              headers={"Auto-Submitted": "auto-replied"}))

    first = await start(home, account, kill_at=point)
    code = await ended(first, home)
    assert code == -signal.SIGKILL, logs(home)

    # Written while Steward is down, in the same thread and in a new one.
    await account.append(mail(message_id="two@example.com", subject="Re: First task",
                              in_reply_to="one@example.com", references=["one@example.com"]))
    await account.append(mail(message_id="three@example.com", subject="Second task"))

    second = await start(home, account, run=1)
    try:
        await sink.wait_for(3, seconds=45)
        await asyncio.sleep(1.0)  # anything sent twice would arrive now
    except TimeoutError:
        second.send_signal(signal.SIGUSR1)  # where each of its tasks waits, into the log
        await asyncio.sleep(1.0)
        pytest.fail(f"{len(sink.messages)} replies:\n{logs(home, 12000)}")
    finally:
        second.send_signal(signal.SIGTERM)
        assert await ended(second, home) == 0, logs(home)

    answered = sorted(m.message["In-Reply-To"] for m in sink.messages)
    assert answered == ["<one@example.com>", "<three@example.com>", "<two@example.com>"]
    by_parent = {m.message["In-Reply-To"]: m.message for m in sink.messages}
    assert by_parent["<one@example.com>"]["Subject"] == "Re: First task"
    assert by_parent["<two@example.com>"]["Subject"] == "Re: First task"
    assert by_parent["<two@example.com>"]["References"] == "<one@example.com> <two@example.com>"
    assert all(m.rcpt_tos == [ALLOWED] for m in sink.messages)
    assert all(m.message["Auto-Submitted"] == "auto-replied" for m in sink.messages)
    sent = await account.messages("Sent")
    assert sorted(m["Message-ID"] for m in sent) == sorted(
        m.message["Message-ID"] for m in sink.messages)
    assert not any(flags & {SENDING, QUEUED} for flags in (await account.flags("Sent")).values())
    assert llm.count("/v1/chat/completions") == 3  # no answer was asked for twice either


async def test_a_kill_between_storing_attachments_and_the_commit_loses_nothing(
        tmp_path, account, sink, llm):
    """The blob is written before the commit that refers to it: killed in between, the
    next start takes the mail again, answers it once, and the blob is there, once (the
    same content under the same hash), the entry naming it."""
    import email.message

    from store import open_store
    from tests.test_attachments import pdf

    store_url = f"sqlite+aiosqlite:///{tmp_path / 'steward.db'}"
    home = make_home(tmp_path, store_url, llm.url, account, sink)
    msg = email.message.EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = ALLOWED, ADDRESS, "The hotel bill"
    msg["Message-ID"] = "<bill@example.com>"
    msg.set_content("Please file this.")
    msg.add_attachment(pdf("Hotel 240 EUR"), maintype="application", subtype="pdf",
                       filename="bill.pdf")
    await account.append(msg.as_bytes())

    first = await start(home, account, kill_at="email-kept:email")
    assert await ended(first, home) == -signal.SIGKILL, logs(home)
    blobs = sorted(p for p in (home / "blobs").rglob("*") if p.is_file())
    assert len(blobs) == 1  # kept, and nothing committed yet

    second = await start(home, account, run=1)
    try:
        await sink.wait_for(1, seconds=45)
        await asyncio.sleep(1.0)  # a second reply would arrive now
    finally:
        second.send_signal(signal.SIGTERM)
        assert await ended(second, home) == 0, logs(home)
    assert [m.message["In-Reply-To"] for m in sink.messages] == ["<bill@example.com>"]
    assert sorted(p for p in (home / "blobs").rglob("*") if p.is_file()) == blobs
    store = await open_store(store_url)
    try:
        [conversation] = await store.list_conversations()
        users = [e for e in await store.entries_page(conversation.id, limit=50)
                 if e.kind == "user"]
    finally:
        await store.close()
    assert len(users) == 1 and "Hotel 240 EUR" in users[0].text
    assert blobs[0].name in str(users[0].data)  # the entry names the blob by its hash

