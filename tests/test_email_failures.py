"""A message that fails on its own never blocks the mailbox: it is tried a few times, then
quarantined with the reason, and the mail after it is answered. An outage (the server or
the store down, the server's storage refusing with `NO [UNAVAILABLE]`) is not the message's
fault: it is waited out, however long, and nothing is quarantined for it; nor is a failure
of any kind that lasts less than `message_quarantine_seconds`. And a NUL byte in a mail,
which the store once refused on PostgreSQL."""

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
from aioimaplib import aioimaplib

from bot import agent_port as port_module
from bot.agent_port import LocalPort
from connectors.email import cursor as cursors
from connectors.email import imap as imap_module
from connectors.email.imap import ImapError, ImapSession
from connectors.email.watcher import Watcher
from tests.fakes.mail_rig import ADDRESS, mail, rig_factory, stored_cursor
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)

CORPUS = Path(__file__).parent / "mail_corpus"


@pytest.fixture
async def make_rig(store, account, sink, tmp_path, monkeypatch):
    monkeypatch.setattr(Watcher, "message_retry_seconds", 0.01)
    monkeypatch.setattr(Watcher, "reconnect_seconds", 0.01)
    # No minimum time a message must have been failing before its quarantine (unless a
    # test sets one): `message_attempts` alone decides, quickly.
    monkeypatch.setattr(Watcher, "message_quarantine_seconds", 0.0)
    async with rig_factory(store, account, sink, tmp_path) as make:
        yield make


async def three_mails(account) -> tuple[int, int, int]:
    first = await account.append(mail(message_id="before@example.com", subject="Before"))
    bad = await account.append(mail(message_id="poison@example.com", subject="Poison",
                                    body="poison"))
    after = await account.append(mail(message_id="after@example.com", subject="After"))
    return first, bad, after


async def assert_quarantined(store, account, uid: int, *fragments: str) -> dict:
    validity = await account.uidvalidity()
    row = await store.submission_state("email", f"imap:{validity}:{uid}")
    assert row is not None and row["state"] == "quarantined", row
    for fragment in fragments:
        assert fragment in row["reason"], row["reason"]
    cursor = await stored_cursor(store, ADDRESS)
    assert cursor.uid >= uid and uid not in cursor.backlog
    return row


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_fetch_the_server_refuses_is_quarantined_and_passed(make_rig, account, sink,
                                                                    store, monkeypatch):
    first, bad, after = await three_mails(account)
    tries = []
    real_fetch = ImapSession.fetch

    async def fetch(self, uid):
        if uid == bad:
            tries.append(uid)
            raise ImapError("FETCH: NO [SERVERBUG] simulated failure of this one message")
        return await real_fetch(self, uid)

    monkeypatch.setattr(ImapSession, "fetch", fetch)
    rig = await make_rig().start()
    replies = await sink.wait_for(2, seconds=30)
    await rig.settle()
    assert sorted(r.message["In-Reply-To"] for r in replies) == [
        "<after@example.com>", "<before@example.com>"]
    assert len(sink.messages) == 2
    assert len(tries) == Watcher.message_attempts  # tried again, then given up on
    await assert_quarantined(store, account, bad, f"{Watcher.message_attempts} attempts",
                             "simulated failure of this one message")


async def test_a_message_the_store_refuses_is_quarantined_and_passed(make_rig, account, sink,
                                                                     store, monkeypatch):
    """As a NUL byte once did on PostgreSQL: the intake's commit fails for that message
    only, on every try."""
    first, bad, after = await three_mails(account)
    tries = []
    real_submit = port_module.submit_message

    async def submit_message(store, **kwargs):
        if "poison" in kwargs["text"]:
            tries.append(kwargs["external_ids"])
            raise ValueError("the store refused this message's text")
        return await real_submit(store, **kwargs)

    monkeypatch.setattr(port_module, "submit_message", submit_message)
    rig = await make_rig().start()
    replies = await sink.wait_for(2, seconds=30)
    await rig.settle()
    assert sorted(r.message["In-Reply-To"] for r in replies) == [
        "<after@example.com>", "<before@example.com>"]
    assert len(sink.messages) == 2 and len(tries) == Watcher.message_attempts
    row = await assert_quarantined(store, account, bad, "ValueError",
                                   "the store refused this message's text")
    assert "poison@example.com" in json.loads(row["payload"])["head"]  # kept to look at
    by_id = await store.submission_state("email", "msgid:poison@example.com")
    assert by_id["state"] == "quarantined"  # recognised after a UIDVALIDITY change too


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_an_outage_is_waited_out_not_blamed_on_the_message(make_rig, account, sink,
                                                                 store, monkeypatch):
    """The store goes down each time the message is being committed and stays down for a
    while (the probe and the next pass see it down): more outages than the message's
    tries, yet the message is answered and nothing is quarantined."""
    await account.append(mail(message_id="patient@example.com", subject="Patient"))
    outages = Watcher.message_attempts + 2
    state = {"failed": 0, "down_for": 0}
    real_submit, real_load = LocalPort.submit, cursors.load

    async def submit(port, **kwargs):
        if state["failed"] < outages:
            state["failed"] += 1
            state["down_for"] = 2
            raise ConnectionResetError("the database connection was lost")
        return await real_submit(port, **kwargs)

    async def load(*args):
        if state["down_for"]:
            state["down_for"] -= 1
            raise ConnectionRefusedError("the database is down")
        return await real_load(*args)

    monkeypatch.setattr(LocalPort, "submit", submit)
    monkeypatch.setattr(cursors, "load", load)
    rig = await make_rig().start(connected=False)
    [reply] = await sink.wait_for(1, seconds=30)
    await rig.settle()
    assert reply.message["In-Reply-To"] == "<patient@example.com>"
    assert state["failed"] == outages and len(sink.messages) == 1
    assert await store.list_submissions(state="quarantined", channel="email") == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_storage_outage_the_server_reports_is_waited_out(make_rig, account, sink,
                                                                 store, monkeypatch):
    """The server answers NOOP and SEARCH but refuses every message body with `NO
    [UNAVAILABLE]` (RFC 5530) for longer than a message's tries, then recovers: the mail is
    answered and nothing is quarantined, though no minimum failing time protects it."""
    first = await account.append(mail(message_id="first@example.com", subject="First"))
    await account.append(mail(message_id="second@example.com", subject="Second"))
    outage = Watcher.message_attempts + 3  # refusals of the first message's FETCH
    state = {"refused": 0, "peeks": 0}
    real_uid = imap_module._Client.uid

    async def uid(self, command, *args, **kwargs):
        if command == "fetch" and "BODY.PEEK[]" in args[-1] and state["refused"] < outage:
            if args[0] == str(first) and args[-1] == "(UID BODY.PEEK[])":
                state["refused"] += 1
            else:
                state["peeks"] += 1  # the watcher looking whether another message reads
            return aioimaplib.Response("NO", [b"[UNAVAILABLE] Mail storage is unavailable"])
        return await real_uid(self, command, *args, **kwargs)

    monkeypatch.setattr(imap_module._Client, "uid", uid)
    rig = await make_rig().start(connected=False)
    replies = await sink.wait_for(2, seconds=30)
    await rig.settle()
    assert sorted(r.message["In-Reply-To"] for r in replies) == [
        "<first@example.com>", "<second@example.com>"]
    assert state["refused"] == outage and state["peeks"] > 0
    assert len(sink.messages) == 2
    assert await store.list_submissions(state="quarantined", channel="email") == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_failures_shorter_than_the_quarantine_time_quarantine_nothing(
        make_rig, account, sink, store, monkeypatch):
    """A refusal that looks like the message's own (no outage code, NOOP fine) but lasts
    only a short while, over more than `message_attempts` tries: the message has not been
    failing for `message_quarantine_seconds`, so it is tried again until it goes through."""
    monkeypatch.setattr(Watcher, "message_quarantine_seconds", 60.0)
    await account.append(mail(message_id="hiccup@example.com", subject="Hiccup"))
    tries = []
    real_fetch = ImapSession.fetch

    async def fetch(self, uid):
        if len(tries) < Watcher.message_attempts + 2:
            tries.append(uid)
            raise ImapError("FETCH: NO Internal error occurred")
        return await real_fetch(self, uid)

    monkeypatch.setattr(ImapSession, "fetch", fetch)
    rig = await make_rig().start()
    [reply] = await sink.wait_for(1, seconds=30)
    await rig.settle()
    assert reply.message["In-Reply-To"] == "<hiccup@example.com>"
    assert len(tries) == Watcher.message_attempts + 2 and len(sink.messages) == 1
    assert await store.list_submissions(state="quarantined", channel="email") == []


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_a_server_that_is_down_is_retried_until_it_is_back(make_rig, account, sink,
                                                                 store, monkeypatch):
    await account.append(mail(message_id="waiting@example.com", subject="Waiting"))
    refused = []
    real_open = ImapSession.open

    async def open_(self):
        if len(refused) < Watcher.message_attempts + 3:
            refused.append(1)
            raise ConnectionRefusedError("IMAP server down")
        await real_open(self)

    monkeypatch.setattr(ImapSession, "open", open_)
    rig = await make_rig().start(connected=False)
    [reply] = await sink.wait_for(1, seconds=30)
    await rig.settle()
    assert reply.message["In-Reply-To"] == "<waiting@example.com>"
    assert await store.list_submissions(state="quarantined", channel="email") == []


async def test_a_nul_byte_in_a_mail_is_answered(make_rig, sink, store):
    """Dovecot turns a NUL into 0x80 on FETCH, so the corpus run never sees one: here the
    raw bytes go to the intake as a server that passes them on would deliver them."""
    raw = (CORPUS / "answer-nul-byte.eml").read_bytes()
    assert b"\x00" in raw
    rig = await make_rig().start(watch=False)
    outcome, _ = await rig.connector.intake.take(cursors.Cursor(7, 0), 1, raw)
    assert outcome == "accepted"
    [reply] = await sink.wait_for(1)
    assert reply.message["In-Reply-To"] == "<nul-byte@example.com>"
    [user, answer] = await rig.transcript("email:nul-byte@example.com")
    assert "Pay the rent\ufffd on Friday." in user.text and "\x00" not in user.text
    assert answer.kind == "assistant"
    await rig.settle()
    assert len(sink.messages) == 1


async def test_steward_run_rides_out_imap_unreachable_at_start(tmp_path):
    """A home server boots before its network is up: a real `steward run` whose IMAP server
    refuses connections stays up, says email is connecting, and tries again with backoff
    (one line a try); SIGTERM then exits 0, no traceback. (Connecting once the server is
    back: `test_a_server_that_is_down_is_retried_until_it_is_back`.)"""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "config.toml"
    config.write_text(f"""[email]
enabled = true
address = "{ADDRESS}"
imap_host = "127.0.0.1"
imap_port = {port}
imap_security = "none"
smtp_host = "127.0.0.1"
smtp_port = {port}
smtp_security = "none"
allowed_senders = ["ann@example.com"]
""")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(tmp_path / "home"), STEWARD_CONFIG=str(config),
               STEWARD_IMAP_PASSWORD="secret")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=env, cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        banner = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert "connectors: email (connecting)" in banner, banner
        await asyncio.sleep(4.0)  # tries at about 0, 1 and 3 s
        assert proc.returncode is None
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    log = err.decode()
    assert proc.returncode == 0, log
    assert "Traceback" not in log
    assert log.count("reconnecting in") >= 2, log
