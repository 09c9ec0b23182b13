"""The one window in which a reply's fate is unknown, killed for real: a `steward run`
(email on, Dovecot + aiosmtpd, the fake LLM server) SIGKILLed around the final dot of SMTP
DATA, started again, and counted at the SMTP sink and in the Sent folder, never from
Steward's database (connectors/email/channel.py tells the window).

- killed with DATA's lines out and the dot not (where the Sent copy used to be flagged as
  being sent, a whole IMAP round trip before the dot): nothing was sent, so it is sent
  after the restart, once;
- killed with the dot written and its Sent copy not yet marked: the server has it, and
  Steward, which cannot know that, sends it again under the same Message-ID: the receiver
  gets one Message-ID (twice), never none;
- killed once the mark is on the copy, before the answer is read: taken as sent, once.

Each ends with exactly one Sent copy per reply, its flags final."""

import asyncio
import signal

import pytest

from connectors.email.channel import QUEUED, SENDING
from tests.fakes.llm_server import FakeLLMServer, Reply, replies
from tests.fakes.mail_rig import ALLOWED, mail
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)
from tests.test_email_crash import ended, logs, make_home, start


@pytest.fixture
def llm():
    with FakeLLMServer(replies(Reply(text="Done, as you asked."))) as server:
        yield server


async def killed_then_restarted(home, account, sink, point: str, *, before: int) -> None:
    """Run until the kill at `point` (the sink then holds `before` messages, waited for),
    start again and let it answer what it owes; SIGTERM."""
    await account.append(mail(message_id="one@example.com", subject="First task"))
    first = await start(home, account, kill_at=point)
    assert await ended(first, home) == -signal.SIGKILL, logs(home)
    if before:
        await sink.wait_for(before, seconds=10)  # the dot reached the server
    assert len(sink.messages) == before, [m.message["Message-ID"] for m in sink.messages]

    second = await start(home, account, run=1)
    try:
        for _ in range(600):  # serving (its SIGTERM handler in place), however busy the box
            if "steward: running on" in (home / "run1.log").read_text(errors="replace"):
                break
            assert second.returncode is None, logs(home)
            await asyncio.sleep(0.1)
        if before == 0:
            try:
                await sink.wait_for(1, seconds=45)
            except TimeoutError:
                pytest.fail(f"the reply was lost: the sink never received it\n"
                            f"{logs(home, 12000)}")
        await asyncio.sleep(2.0)  # anything sent (again) would arrive now
    finally:
        second.send_signal(signal.SIGTERM)
        assert await ended(second, home) == 0, logs(home)


async def one_sent_copy(account, message_id: str) -> None:
    sent = await account.messages("Sent")
    assert [m["Message-ID"] for m in sent] == [message_id]
    assert sent[0]["In-Reply-To"] == "<one@example.com>"
    assert not any(flags & {QUEUED, SENDING} for flags in (await account.flags("Sent")).values())


@pytest.mark.parametrize("store_url", ["sqlite", "postgres"], indirect=True)
async def test_a_kill_after_the_journal_before_the_dot_sends_the_reply_once(
        store_url, tmp_path, account, sink, llm):
    """The finding: the copy was flagged `$StewardSending` before the dot, the kill came
    before the dot, and the restart took the flagged copy as sent: lost."""
    home = make_home(tmp_path, store_url, llm.url, account, sink)
    await killed_then_restarted(home, account, sink, "smtp-before-dot:email", before=0)
    [reply] = sink.messages
    assert reply.message["In-Reply-To"] == "<one@example.com>"
    assert reply.rcpt_tos == [ALLOWED]
    await one_sent_copy(account, reply.message["Message-ID"])
    assert llm.count("/v1/chat/completions") == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_kill_after_the_dot_before_its_mark_resends_under_one_message_id(
        store_url, tmp_path, account, sink, llm):
    """Inside the window: the server took the message, Steward never learnt it. Sent again
    with the same Message-ID (the reply's idempotency key): two copies at the server, one
    message for the receiver, who dedupes by Message-ID. Never none."""
    home = make_home(tmp_path, store_url, llm.url, account, sink)
    await killed_then_restarted(home, account, sink, "smtp-dot:email", before=1)
    ids = {m.message["Message-ID"] for m in sink.messages}
    assert len(ids) == 1, ids  # one reply, as the receiver sees it
    assert len(sink.messages) == 2  # the accepted cost of the window: the same one, again
    assert {m.message["In-Reply-To"] for m in sink.messages} == {"<one@example.com>"}
    assert "sent again under the same Message-ID" in logs(home, 40000)
    await one_sent_copy(account, ids.pop())
    assert llm.count("/v1/chat/completions") == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_kill_once_the_dot_is_marked_takes_the_reply_as_sent(
        store_url, tmp_path, account, sink, llm):
    """The mark is on the Sent copy only after the dot was written: killed there (the
    answer not read yet), the reply is taken as sent and not repeated."""
    home = make_home(tmp_path, store_url, llm.url, account, sink)
    await killed_then_restarted(home, account, sink, "smtp-marked:email", before=1)
    [reply] = sink.messages
    assert reply.message["In-Reply-To"] == "<one@example.com>"
    await one_sent_copy(account, reply.message["Message-ID"])
