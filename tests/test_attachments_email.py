"""Attachments of real mail (Dovecot in, aiosmtpd out): an image goes to the model (the
fake provider, Anthropic wire), documents become text, hostile files become notes, and the
mail is answered all the same. The bytes are blobs in the home, not in the transcript."""

from email.message import EmailMessage

import httpx

from bot.llm.anthropic import AnthropicClient
from bot.port import REF
from tests.fakes.llm_server import FakeLLMServer, images
from tests.fakes.mail_rig import ADDRESS, ALLOWED, rigs_fixture  # noqa: F401 - fixture
from tests.fakes.mail_servers import (  # noqa: F401 - fixtures
    account_fixture,
    dovecot_fixture,
    sink_fixture,
)
from tests.test_attachments import XLSX, jpeg, pdf, xlsx, zip_bomb_docx


def with_attachments(message_id: str) -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = ALLOWED, ADDRESS, "Receipts"
    msg["Message-ID"] = f"<{message_id}>"
    msg.set_content("What did I spend?")
    msg.add_attachment(jpeg(2400, 1800), maintype="image", subtype="jpeg",
                       filename="receipt.jpg")
    msg.add_attachment(xlsx([["Shop", "Amount"], ["Bakery", 12]]), maintype="application",
                       subtype=XLSX.split("/")[1], filename="spend.xlsx")
    msg.add_attachment(pdf("Hotel 240 EUR"), maintype="application", subtype="pdf",
                       filename="hotel.pdf")
    msg.add_attachment(zip_bomb_docx(), maintype="application", subtype="octet-stream",
                       filename="bomb.docx")
    msg.add_attachment(b"%PDF-1.4 garbage " * 20, maintype="application", subtype="pdf",
                       filename="broken.pdf")
    msg.add_attachment(b"MZ\x90\x00" + bytes(200), maintype="application",
                       subtype="octet-stream", filename="setup.exe")
    return bytes(msg)


async def test_mail_attachments_reach_the_model_and_bad_ones_are_notes(rigs, account, sink,
                                                                       tmp_path):
    await account.append(with_attachments("receipts@example.com"))
    with FakeLLMServer() as llm:
        http = httpx.AsyncClient()
        rig = rigs(max_attachment_bytes=2_000_000)
        rig.deps.client = AnthropicClient(http, base_url=llm.url, api_key="k", model="m")
        try:
            await rig.start()
            [reply] = await sink.wait_for(1, seconds=60)
        finally:
            await http.aclose()
        [request] = [r for r in llm.requests if r.path == "/v1/messages"]
    assert reply.message.get_payload(decode=True).decode().strip() == "ok"

    [user] = [e for e in await rig.transcript("email:receipts@example.com") if e.kind == "user"]
    assert "[image: receipt.jpg (image/jpeg, " in user.text and "2400×1800, shown at" in user.text
    assert "[sheet Budget]\nShop\tAmount\nBakery\t12" in user.text
    assert "[page 1]\nHotel 240 EUR" in user.text
    assert "[attached file: bomb.docx (application/octet-stream, " in user.text
    assert "claims more than" in user.text
    assert "[attached file: broken.pdf (application/pdf, " in user.text
    assert "(not read: the PDF" in user.text
    assert "[attached file: setup.exe (application/octet-stream, 204 bytes)] (not a text " \
           "file; not read)" in user.text
    refs = user.data[REF]
    assert [r["kind"] for r in refs] == ["image", "xlsx", "pdf", "unreadable", "unreadable",
                                         "binary"]
    notes = user.data["email"]["attachments"]
    assert [n.get("blob") for n in notes] == [r.get("blob") for r in refs]
    # the transcript holds refs, not bytes; the model got the image from the blob
    assert len(user.text) + len(str(user.data)) < 20_000
    [(media_type, sent)] = images(request)
    blob = refs[0]["blob"]
    assert media_type == "image/jpeg"
    assert sent == (tmp_path / "blobs" / blob[:2] / blob).read_bytes()
