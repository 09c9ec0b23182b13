"""The email connector against a real Dovecot and a real SMTP server, in-process, on both
store backends: receiving without \\Seen, replies and their headers, the Sent copy, threads,
the cursor across restarts, a UIDVALIDITY change, IDLE and polling."""

import asyncio

import pytest
from aioimaplib import aioimaplib

from bot.channels import Outbound
from connectors.email.channel import SENDING
from connectors.email.imap import _Client
from connectors.email.reply import reply_message_id
from tests.fakes.mail_rig import (  # noqa: F401 - rigs_fixture
    ADDRESS,
    ALLOWED,
    Rig,
    mail,
    rigs_fixture,
    stored_cursor,
)
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    Dovecot,
    SmtpSink,
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)
from tests.fakes.mail_tls import client_context


async def test_a_mail_gets_one_threaded_reply_and_stays_unread(rigs, account, sink):
    await account.append(mail(message_id="task-1@example.com", subject="Plan the trip",
                              body="Book the train.\n\nOn Mon, Bob <b@x.com> wrote:\n> old"))
    rig = await rigs().start()
    [reply] = await sink.wait_for(1)
    msg = reply.message
    assert reply.rcpt_tos == [ALLOWED] and reply.mail_from == ADDRESS
    assert msg["Subject"] == "Re: Plan the trip"
    assert msg["In-Reply-To"] == "<task-1@example.com>"
    assert msg["References"] == "<task-1@example.com>"
    assert msg["Auto-Submitted"] == "auto-replied"
    assert msg["From"] == f"Steward <{ADDRESS}>"
    assert msg.get_payload(decode=True).decode().strip() == "Answer to [Subject: Plan the trip]"
    assert "\\Seen" not in (await account.flags())[1]  # BODY.PEEK[]: still unread
    [copy] = await account.messages("Sent")
    assert copy["Message-ID"] == msg["Message-ID"]
    assert all(SENDING not in f and "\\Seen" in f for f in (await account.flags("Sent")).values())

    entries = await rig.transcript("email:task-1@example.com")
    user = entries[0]
    assert user.kind == "user" and user.author == ALLOWED
    assert "Book the train." in user.text and "old" not in user.text  # trimmed for the model
    assert "> old" in user.data["email"]["full_text"]  # kept in the store
    assert user.ref == "msgid:task-1@example.com"
    await rig.settle()
    assert len(sink.messages) == 1


async def test_follow_ups_stay_in_their_thread(rigs, account, sink, store):
    await account.append(mail(message_id="root@example.com", subject="Budget"))
    rig = await rigs().start()
    [first] = await sink.wait_for(1)
    reply_id = first.message["Message-ID"].strip("<>")
    # A proper reply (full References), one that keeps only In-Reply-To, and a new thread.
    await account.append(mail(message_id="r2@example.com", subject="Re: Budget",
                              in_reply_to=reply_id, references=["root@example.com", reply_id]))
    await sink.wait_for(2)
    await account.append(mail(message_id="r3@example.com", subject="RE: Budget",
                              in_reply_to=reply_id))
    await account.append(mail(message_id="other@example.com", subject="Budget"))
    replies = {r.message["In-Reply-To"]: r.message for r in await sink.wait_for(4)}
    second = replies["<r2@example.com>"]
    assert second["Subject"] == "Re: Budget"  # never "Re: Re:"
    assert second["References"].split() == ["<root@example.com>", f"<{reply_id}>",
                                            "<r2@example.com>"]
    assert replies["<r3@example.com>"]["Subject"] == "RE: Budget"
    entries = await rig.transcript("email:root@example.com")
    assert [e.kind for e in entries] == ["user", "assistant"] * 3
    assert len(await rig.transcript("email:other@example.com")) == 2


async def test_a_reply_to_an_answer_of_a_predecessor_finds_its_own_thread(rigs, account,
                                                                          sink, store):
    # A home restored from a backup numbers the conversations its predecessor began after
    # the snapshot anew: the number in the predecessor's answer's Message-ID names another
    # thread here (the restore test, seed 72472: a reply threaded under the wrong answer).
    await account.append(mail(message_id="here@example.com", subject="Budget"))
    rig = await rigs().start()
    await sink.wait_for(1)
    here = await store.get_conversation("email:here@example.com")
    theirs = reply_message_id(Outbound(
        key="in.PREDECESSOR.answer", conversation_key="email:gone@example.com",
        conversation_id=here.id, text="", reply_to={}), ADDRESS)
    await account.append(mail(message_id="back@example.com", subject="Re: Trip",
                              in_reply_to=theirs, references=["gone@example.com", theirs]))
    replies = {r.message["In-Reply-To"]: r.message for r in await sink.wait_for(2)}
    assert replies["<back@example.com>"]["Subject"] == "Re: Trip"
    assert [e.kind for e in await rig.transcript("email:here@example.com")] == [
        "user", "assistant"]
    assert [e.ref for e in await rig.transcript("email:gone@example.com")][0] == \
        "msgid:back@example.com"


async def test_mail_that_arrives_while_stopped_is_answered_on_start(rigs, account, sink):
    await account.append(mail(message_id="m1@example.com"))
    rig = await rigs().start()
    await sink.wait_for(1)
    await rig.stop()
    await account.append(mail(message_id="m2@example.com", subject="Second"))
    await account.append(mail(message_id="m3@example.com", subject="Third"))
    rig2 = await rigs().start()
    replies = await sink.wait_for(3)
    await rig2.settle()
    assert len(sink.messages) == 3
    assert sorted(r.message["In-Reply-To"] for r in replies) == [
        "<m1@example.com>", "<m2@example.com>", "<m3@example.com>"]
    cursor = await stored_cursor(rig2.store, ADDRESS)
    assert (cursor.uidvalidity, cursor.uid, cursor.backlog) == (
        await account.uidvalidity(), 3, ())


async def test_a_thread_without_message_ids(rigs, account, sink, store):
    await account.append(b"From: ann@example.com\r\nTo: steward@example.com\r\n"
                         b"Subject: Lunch\r\n\r\nBook a table.\r\n")
    rig = await rigs().start()
    [reply] = await sink.wait_for(1)
    assert reply.message["In-Reply-To"] is None and reply.message["Subject"] == "Re: Lunch"
    ours = reply.message["Message-ID"].strip("<>")  # carries the conversation
    await account.append(mail(message_id="lunch-2@example.com", subject="Re: Lunch",
                              in_reply_to=ours))
    [_, second] = await sink.wait_for(2)
    assert second.message["References"].split() == [f"<{ours}>", "<lunch-2@example.com>"]
    row = await store.submission_state("email", "msgid:lunch-2@example.com")
    conversation = await store.get_conversation_by_id(row["conversation_id"])
    assert conversation.key.startswith("email:no-id:")
    assert [e.kind for e in await rig.transcript(conversation.key)] == ["user", "assistant"] * 2


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_first_start_takes_unread_mail_only(rigs, account, sink):
    await account.append(mail(message_id="old@example.com", subject="Old"), flags="\\Seen")
    await account.append(mail(message_id="new@example.com", subject="New"))
    rig = await rigs().start()
    [reply] = await sink.wait_for(1)
    await rig.settle()
    assert reply.message["In-Reply-To"] == "<new@example.com>" and len(sink.messages) == 1


async def test_a_new_uidvalidity_answers_nothing_twice(rigs, account, sink):
    await account.create("Tasks")
    first = [mail(message_id=f"t{i}@example.com", subject=f"Task {i}") for i in (1, 2)]
    for raw in first:
        await account.append(raw, "Tasks")
    rig = await rigs(mailbox="Tasks").start()
    await sink.wait_for(2)
    await rig.stop()
    before = await account.uidvalidity("Tasks")
    await account.recreate("Tasks")  # e.g. the server was migrated
    for raw in [*first, mail(message_id="t3@example.com", subject="Task 3")]:
        await account.append(raw, "Tasks")
    assert await account.uidvalidity("Tasks") != before
    rig2 = await rigs(mailbox="Tasks").start()
    replies = await sink.wait_for(3)
    await rig2.settle(1.0)
    assert len(sink.messages) == 3
    assert replies[2].message["In-Reply-To"] == "<t3@example.com>"


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_idle_picks_up_new_mail_quickly(rigs, account, sink):
    rig = await rigs(idle_seconds=60.0, poll_seconds=60.0).start()
    await asyncio.sleep(0.3)  # in IDLE now (or not yet: then its first look finds it)
    await account.append(mail(message_id="quick@example.com"))
    started = asyncio.get_running_loop().time()
    await sink.wait_for(1, seconds=60)
    # Well before the 60 s poll would have found it, however loaded the machine.
    assert asyncio.get_running_loop().time() - started < 30
    assert rig.connector.watcher.connected.is_set()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_idle_is_reissued_and_keeps_working(rigs, account, sink, monkeypatch):
    started, clients = [], set()  # each IDLE command sent to the server; on which client
    idled = asyncio.Event()

    async def idle_start(self, *args, **kwargs):
        started.append(asyncio.get_running_loop().time())
        clients.add(id(self))
        idled.set()
        return await aioimaplib.IMAP4.idle_start(self, *args, **kwargs)

    monkeypatch.setattr(_Client, "idle_start", idle_start)
    await rigs(idle_seconds=0.3).start()

    async def reissued(count: int) -> None:
        while len(started) < count:
            idled.clear()
            await idled.wait()
    await asyncio.wait_for(reissued(4), 60)  # IDLE ended and began again a few times
    gaps = [b - a for a, b in zip(started, started[1:], strict=False)]
    assert min(gaps) > 0.2  # each one held for its idle_seconds, not a tight loop
    await account.append(mail(message_id="later@example.com"))
    await sink.wait_for(1, seconds=60)
    before = len(started)
    await asyncio.wait_for(reissued(before + 2), 60)  # and it goes on after the mail
    assert len(clients) == 1  # all on the one connection: re-issued, not reconnected


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_polling_when_the_server_has_no_idle(store, sink, tmp_path):
    with Dovecot(idle=False) as server:
        mailbox = server.account()
        rig = await Rig(store, mailbox, sink, tmp_path, poll_seconds=0.3).start()
        try:
            await asyncio.sleep(0.2)
            await mailbox.append(mail(message_id="polled@example.com"))
            await sink.wait_for(1, seconds=60)
        finally:
            await rig.stop()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
@pytest.mark.parametrize(("imap_security", "smtp_security"),
                         [("ssl", "starttls"), ("starttls", "ssl")])
async def test_tls_both_ways(store, account, tmp_path, imap_security, smtp_security):
    sink = await SmtpSink(tls=smtp_security).start()
    port = account.server.tls_port if imap_security == "ssl" else account.port
    rig = Rig(store, account, sink, tmp_path, imap_security=imap_security, imap_port=port,
              smtp_security=smtp_security, connector={"ssl_context": client_context()})
    try:
        await account.append(mail(message_id="tls@example.com"))
        await rig.start()
        [reply] = await sink.wait_for(1)
        assert reply.message["In-Reply-To"] == "<tls@example.com>"
        assert len(await account.messages("Sent")) == 1
    finally:
        await rig.stop()
        await sink.stop()
