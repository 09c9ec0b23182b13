"""Who gets an answer (allowed senders, RFC 3834, Authentication-Results) and how the
channel behaves around a crash, a refusal or a connection lost: `find` in Sent, the
in-doubt journal copy, a refused send, a send cut off during DATA, IMAP down."""

import asyncio
import json
import re
from pathlib import Path

import pytest

from bot.channels import Outbound
from bot.runtime import NotPerformed, Unavailable
from connectors.email.channel import QUEUED, SENDING
from connectors.email.reply import reply_message_id
from tests.fakes.mail_rig import Rig, mail, rig_factory
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    free_port,
    sink_fixture,
)

CORPUS = Path(__file__).parent / "mail_corpus"


@pytest.fixture
async def make_rig(store, account, sink, tmp_path):
    async with rig_factory(store, account, sink, tmp_path) as make:
        yield make


PASS = "mx.example.com; dkim=pass header.d=example.com; spf=pass; dmarc=pass header.from=x"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_allowed_senders_any_case_and_whole_domains(store, account, sink, tmp_path):
    await account.append(mail(sender="Ann@Example.COM", message_id="a@x"))
    await account.append(mail(sender="bob@team.example.org", message_id="b@x"))
    await account.append(mail(sender="carol@example.net", message_id="c@x"))
    await account.append(mail(sender="dave@other.example.org", message_id="d@x"))
    rig = await Rig(store, account, sink, tmp_path,
                    allowed_senders=["ann@example.com", "@team.example.org"]).start()
    try:
        await sink.wait_for(2)
        await rig.settle()
    finally:
        await rig.stop()
    assert sorted(m.rcpt_tos[0] for m in sink.messages) == ["ann@example.com",
                                                           "bob@team.example.org"]
    row = await store.submission_state("email", "msgid:c@x")
    assert "not allowed" in row["payload"] and row["task_id"] is None


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_authentication_results_can_be_required(store, account, sink, tmp_path):
    await account.append(mail(message_id="pass@x", headers={"Authentication-Results": PASS}))
    await account.append(mail(message_id="none@x"))
    await account.append(mail(message_id="forged@x", headers={
        "Authentication-Results": "mx.example.com; dkim=pass header.d=evil.example; "
                                  "dmarc=fail"}))
    await account.append(mail(message_id="older@x", headers={
        "Authentication-Results": "mx.example.com; spf=softfail; dkim=none"}))
    await account.append(mail(message_id="aligned@x", headers={
        "Authentication-Results": "mx.example.com; dkim=pass header.d=example.com"}))
    rig = await Rig(store, account, sink, tmp_path, require_auth_results=True,
                    authserv_id="mx.example.com").start()
    try:
        await sink.wait_for(2)
        await rig.settle()
    finally:
        await rig.stop()
    assert sorted(m.message["In-Reply-To"] for m in sink.messages) == ["<aligned@x>",
                                                                      "<pass@x>"]


# With everyone allowed, only the RFC 3834 rules (and the own-address rule) can refuse these.
AUTOMATIC = {
    "skip-auto-reply.eml": "Auto-Submitted: auto-replied",
    "skip-bounce.eml": "Auto-Submitted: auto-replied",
    "skip-mailing-list.eml": "mailing-list mail (List-Id)",
    "skip-precedence-bulk.eml": "Precedence: bulk",
    "skip-postmaster.eml": "automated sender postmaster@example.com",
    "skip-own-address.eml": "mail from Steward's own address",
    "skip-empty-return-path.eml": "empty return path (a bounce)",
}


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_automatic_mail_is_refused_even_when_everyone_is_allowed(store, account, sink,
                                                                       tmp_path):
    for name in AUTOMATIC:
        await account.append((CORPUS / name).read_bytes())
    await account.append((CORPUS / "skip-stranger.eml").read_bytes())  # a person: answered
    rig = await Rig(store, account, sink, tmp_path, allowed_senders=[],
                    allow_everyone=True).start()
    try:
        [reply] = await sink.wait_for(1)
        await rig.settle()
    finally:
        await rig.stop()
    assert reply.rcpt_tos == ["mallory@evil.example"] and len(sink.messages) == 1
    for name, reason in AUTOMATIC.items():
        message_id = next(line for line in (CORPUS / name).read_text().splitlines()
                          if line.startswith("Message-ID:")).split("<")[1].rstrip(">")
        row = await store.submission_state("email", f"msgid:{message_id}")
        assert row is not None and row["task_id"] is None, name
        assert json.loads(row["payload"])["skipped"] == reason, name


def outbound(key: str = "turn1.answer") -> Outbound:
    return Outbound(key=key, conversation_key="email:root@x", conversation_id=7,
                    text="The answer.", reply_to={"to": "ann@example.com", "subject": "Task",
                                                  "message_id": "root@x", "references": []})


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_find_tells_sent_from_never_sent(make_rig, account, sink):
    channel = make_rig().connector.channel
    message = outbound()
    assert await channel.find(message) is None  # never sent: the delivery sends it
    sent = await channel.send(message)
    assert sent["message_id"] == reply_message_id(message, "steward@example.com")
    assert re.match(r"c7-[0-9a-f]{8}\.turn1\.answer@", sent["message_id"])
    found = await channel.find(message)
    assert found["message_id"] == sent["message_id"] and not found["in_doubt"]
    assert len(sink.messages) == 1


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_journal_copy_left_by_a_crash_counts_as_sent(make_rig, account, sink):
    channel = make_rig().connector.channel
    message = outbound("turn2.answer")
    mid = reply_message_id(message, "steward@example.com")
    await account.append(mail(sender="steward@example.com", message_id=mid), "Sent",
                         flags=f"\\Seen {SENDING}")
    found = await channel.find(message)
    assert found["in_doubt"] is True  # taken as sent, never repeated
    assert not any(SENDING in f for f in (await account.flags("Sent")).values())
    assert sink.messages == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_journal_copy_queued_before_data_is_not_sent_and_is_replaced(
        make_rig, account, sink):
    """A crash after the Sent copy but before DATA began: nothing went out, so the reply is
    sent now, and Sent ends with exactly one final copy."""
    channel = make_rig().connector.channel
    message = outbound("turn2b.answer")
    mid = reply_message_id(message, "steward@example.com")
    await account.append(mail(sender="steward@example.com", message_id=mid), "Sent",
                         flags=f"\\Seen {QUEUED}")
    assert await channel.find(message) is None
    assert await account.messages("Sent") == []
    await channel.send(message)
    assert len(sink.messages) == 1
    [flags] = (await account.flags("Sent")).values()
    assert not flags & {QUEUED, SENDING}


class Refusing:
    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd
        return "554 5.7.1 refused"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_refused_send_leaves_no_journal_and_is_retried(make_rig, account, sink,
                                                               monkeypatch):
    channel = make_rig().connector.channel
    monkeypatch.setattr(sink, "handle_DATA", Refusing().handle_DATA)
    with pytest.raises(NotPerformed):
        await channel.send(outbound("turn3.answer"))
    assert await account.messages("Sent") == []
    assert await channel.find(outbound("turn3.answer")) is None


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_an_unreachable_smtp_server_is_not_performed(make_rig, account, sink):
    channel = make_rig(smtp_port=1).connector.channel
    with pytest.raises(NotPerformed):
        await channel.send(outbound("turn4.answer"))
    assert await account.messages("Sent") == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_another_sender_cannot_join_someone_elses_thread(store, account, sink, tmp_path):
    await account.append(mail(message_id="ann-root@x", subject="My salary"))
    rig = await Rig(store, account, sink, tmp_path,
                    allowed_senders=["ann@example.com", "bob@example.com"]).start()
    try:
        [first] = await sink.wait_for(1)
        ours = first.message["Message-ID"].strip("<>")
        await account.append(mail(sender="bob@example.com", message_id="bob@x",
                                  subject="Re: My salary", in_reply_to=ours,
                                  references=["ann-root@x", ours]))
        [_, second] = await sink.wait_for(2)
    finally:
        await rig.stop()
    assert second.rcpt_tos == ["bob@example.com"]
    bob = await store.get_conversation("email:ann-root@x/from:bob@example.com")
    assert bob.owner == "bob@example.com"
    assert [e.author for e in await store.entries_page(bob.id) if e.kind == "user"] == [
        "bob@example.com"]
    ann = await store.get_conversation("email:ann-root@x")
    assert len(await store.entries_page(ann.id)) == 2  # Bob's mail is not in Ann's thread


class DropsDuringData:
    """An SMTP server whose connection dies once the whole message is in, before it
    answers: the client cannot tell whether the mail went out."""

    def __init__(self):
        self.calls = 0

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd
        self.calls += 1
        server.transport.abort()
        return "250 never heard"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_send_cut_off_during_data_is_in_doubt_and_kept(make_rig, account, sink,
                                                               monkeypatch):
    channel = make_rig().connector.channel
    drop = DropsDuringData()
    monkeypatch.setattr(sink, "handle_DATA", drop.handle_DATA)
    message = outbound("turn5.answer")
    with pytest.raises(Unavailable):
        await channel.send(message)
    assert drop.calls == 1
    [flags] = (await account.flags("Sent")).values()
    assert SENDING in flags  # the journal copy stays: it may have gone out
    found = await channel.find(message)  # what the reconcile before any retry asks
    assert found["in_doubt"] is True
    assert not any(SENDING in f for f in (await account.flags("Sent")).values())


async def test_a_delivery_cut_off_during_data_is_reconciled_never_sent_twice(
        make_rig, account, sink, store, monkeypatch):
    drop = DropsDuringData()
    monkeypatch.setattr(sink, "handle_DATA", drop.handle_DATA)
    await account.append(mail(message_id="doubt@example.com", subject="In doubt"))
    rig = await make_rig().start()

    async def delivered():
        while True:
            tasks = await store.list_tasks(kind="deliver", limit=10)
            if tasks and tasks[0].state in ("done", "failed", "interrupted"):
                return tasks
            await asyncio.sleep(0.05)
    [task] = await asyncio.wait_for(delivered(), 30)
    await rig.settle()
    assert (task.state, task.result["in_doubt"]) == ("done", True), (task.state, task.error)
    assert drop.calls == 1 and sink.messages == []  # tried once, never again
    [copy] = await account.messages("Sent")
    assert copy["In-Reply-To"] == "<doubt@example.com>"
    assert not any(SENDING in f for f in (await account.flags("Sent")).values())


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_imap_down_while_looking_in_sent_is_unavailable(make_rig, account, sink):
    channel = make_rig(imap_port=free_port()).connector.channel  # nothing listens there
    with pytest.raises(Unavailable):
        await channel.find(outbound("turn6.answer"))


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_sent_mailbox_that_does_not_exist_yet_holds_nothing(make_rig, account, sink):
    channel = make_rig(sent_mailbox="Outbox").connector.channel
    message = outbound("turn7.answer")
    assert await channel.find(message) is None  # a crash before the first journal copy
    await channel.send(message)  # creates it
    assert (await channel.find(message))["in_doubt"] is False
    assert len(await account.messages("Outbox")) == 1 and len(sink.messages) == 1


class DropsBeforeData:
    """An SMTP server that goes away after accepting the envelope, while Steward writes
    its journal copy: DATA never starts, so nothing can have gone out."""

    async def handle_RCPT(self, server, session, envelope, address, options):  # noqa: N802
        envelope.rcpt_tos.append(address)
        asyncio.get_running_loop().call_soon(server.transport.close)  # after this answer
        return "250 OK"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_server_gone_before_data_is_not_performed(make_rig, account, sink,
                                                          monkeypatch):
    channel = make_rig().connector.channel
    monkeypatch.setattr(sink, "handle_RCPT", DropsBeforeData().handle_RCPT, raising=False)
    message = outbound("turn8.answer")
    with pytest.raises(NotPerformed):
        await channel.send(message)
    assert await account.messages("Sent") == []  # the journal copy was removed
    assert await channel.find(message) is None  # so the retry sends it
    assert sink.messages == []
