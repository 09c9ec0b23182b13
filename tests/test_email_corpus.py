"""A corpus of hostile and odd mail (tests/mail_corpus/) through the real connector: no
crash, one reply where one is due and none elsewhere, quarantine where the mail cannot be
read, and the good mail after all of it still answered."""

import json
from email.message import EmailMessage
from pathlib import Path

import pytest

from store import NotFound
from tests.fakes.mail_rig import ALLOWED, Rig, mail
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)

CORPUS = Path(__file__).parent / "mail_corpus"

# What the model must be able to read of some of them.
READABLE = {
    "answer-html-only.eml": ["Please book the room & order lunch.", "Monday", "Guests"],
    "answer-mislabelled-latin1.eml": ["Grüße aus Köln"],
    "answer-unknown-charset.eml": ["Déjà vu: réservez la salle"],
    "answer-8bit-headers.eml": ["Subject: Überweisung prüfen", "Überweisung prüfen."],
    "answer-encoded-words.eml": ["Задача на завтра", "Купить билеты на поезд."],
    "answer-iso-2022-jp.eml": ["会議", "明日の会議を予約してください。"],
    "answer-utf16.eml": ["Order new toner."],
    "answer-text-attachment.eml": ["Sum the second column", "numbers.csv", "milk,4",
                                   "píxel.png (image/png"],
    "answer-forwarded.eml": ["Can you pay this one?", "Amount due: 99 EUR."],
    "answer-top-posted-reply.eml": ["Thursday works, book it."],
    "answer-missing-boundary.eml": ["Call the plumber tomorrow."],
    "answer-unterminated-multipart.eml": ["Water the plants."],
    "answer-no-mime-headers.eml": ["Naïve café, smörgåsbord."],
    "answer-huge-attachment": ["report.pdf", "not stored: larger than"],
    # Dovecot hands a NUL out as 0x80 (test_email_failures takes the raw NUL directly).
    "answer-nul-byte.eml": ["Pay the rent", "on Friday.", "a stray NUL byte"],
}
UNREADABLE = {
    "answer-html-only.eml": ["<p>", "alert(", "color: red"],
    "answer-top-posted-reply.eml": ["Which day suits you?", "Ann"],
}


def huge_attachment() -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = ALLOWED, "steward@example.com", "Big file"
    msg["Message-ID"] = "<huge-attachment@example.com>"
    msg.set_content("The report is attached.")
    msg.add_attachment(b"%PDF" + bytes(600_000), maintype="application", subtype="pdf",
                       filename="report.pdf")
    return bytes(msg)


def too_big() -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = ALLOWED, "steward@example.com", "Way too big"
    msg["Message-ID"] = "<too-big@example.com>"
    msg.set_content("x" * 2_000_000)
    return bytes(msg)


async def test_hostile_mail_never_blocks_the_mailbox(store, account, sink, tmp_path):
    uids: dict[str, int] = {}
    for path in sorted(CORPUS.glob("*.eml")):
        uids[path.name] = await account.append(path.read_bytes())
    uids["answer-huge-attachment"] = await account.append(huge_attachment())
    uids["quarantine-too-big"] = await account.append(too_big())
    uids["answer-last"] = await account.append(mail(message_id="last@example.com"))
    due = [name for name in uids if name.startswith("answer-")]

    rig = Rig(store, account, sink, tmp_path, max_attachment_bytes=100_000,
              connector={"max_message_bytes": 1_500_000})
    await rig.start()
    try:
        await sink.wait_for(len(due), seconds=60)
        await rig.settle(1.0)
    finally:
        await rig.stop()
    assert len(sink.messages) == len(due)
    assert "<last@example.com>" in [m.message["In-Reply-To"] for m in sink.messages]

    validity = await account.uidvalidity()
    for name, uid in uids.items():
        row = await store.submission_state("email", f"imap:{validity}:{uid}")
        assert row is not None, name
        if name.startswith("quarantine-"):
            assert row["state"] == "quarantined" and row["reason"], name
            continue
        assert row["state"] == "accepted", name
        payload = json.loads(row["payload"])
        if name.startswith("skip-"):
            assert payload.get("skipped") and row["task_id"] is None, name
            continue
        assert row["task_id"], name
        entries = await store.entries_page(row["conversation_id"], limit=50)
        [user] = [e for e in entries if e.task_id == row["task_id"] and e.kind == "user"]
        for text in READABLE.get(name, []):
            assert text in user.text, (name, text, user.text)
        for text in UNREADABLE.get(name, []):
            assert text not in user.text, (name, text, user.text)


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # backend-agnostic
async def test_attachments_are_stored_as_documents_with_a_cap(store, account, sink, tmp_path):
    await account.append((CORPUS / "answer-text-attachment.eml").read_bytes())
    await account.append(huge_attachment())
    rig = await Rig(store, account, sink, tmp_path, max_attachment_bytes=100_000).start()
    try:
        await sink.wait_for(2)
    finally:
        await rig.stop()
    conversation = await store.get_conversation("email:text-attachment@example.com")
    [user] = [e for e in await store.entries_page(conversation.id) if e.kind == "user"]
    notes = user.data["email"]["attachments"]
    assert [n["filename"] for n in notes] == ["numbers.csv", "píxel.png"]
    doc = await store.read_document(f"conversation:{conversation.id}", notes[0]["document"])
    assert doc.value["filename"] == "numbers.csv" and doc.value["size"] == notes[0]["size"]
    big = await store.get_conversation("email:huge-attachment@example.com")
    [user] = [e for e in await store.entries_page(big.id) if e.kind == "user"]
    [note] = user.data["email"]["attachments"]
    assert note["document"] is None and note["omitted"] and note["size"] > 600_000
    try:
        await store.read_document(f"conversation:{big.id}", "anything")
    except NotFound:
        pass
