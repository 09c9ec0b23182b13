"""Who gets an answer (allowed senders, Authentication-Results) and how the channel behaves
around a crash or a refusal: `find` in Sent, the in-doubt journal copy, a refused send."""

import pytest

from bot.channels import Outbound
from bot.runtime import NotPerformed
from connectors.email.channel import SENDING
from connectors.email.reply import reply_message_id
from tests.fakes.mail_rig import Rig, mail
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)


@pytest.fixture
async def make_rig(store, account, sink, tmp_path):
    made = []

    def make(**email) -> Rig:
        made.append(Rig(store, account, sink, tmp_path, **email))
        return made[-1]

    yield make
    for rig in made:
        await rig.stop()


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
    rig = await Rig(store, account, sink, tmp_path, require_auth_results=True).start()
    try:
        await sink.wait_for(2)
        await rig.settle()
    finally:
        await rig.stop()
    assert sorted(m.message["In-Reply-To"] for m in sink.messages) == ["<aligned@x>",
                                                                      "<pass@x>"]


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
    assert sent["message_id"].startswith("c7.turn1.answer@")
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
