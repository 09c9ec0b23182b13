"""Images and documents shared in Slack, end to end: the fake Slack serves the files over
real HTTP, the connector keeps them through the port, the model (the fake provider, OpenAI
wire) receives the image, and the answer is posted. Bad files are notes; the rest of the
message is still answered."""

import httpx

from bot.llm.openai import OpenAIClient
from bot.port import REF
from tests.fakes.llm_server import FakeLLMServer, images
from tests.fakes.slack_events import says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import TEAM
from tests.test_attachments import DOCX, docx, pdf, png, png_header_only

DM, ALICE = "D0ALICE", "U0ALICE"
KEY = f"slack:{TEAM}:{DM}"


async def user_entries(store):
    conversation = await store.get_conversation(KEY)
    return [e for e in await store.entries_page(conversation.id, limit=100) if e.kind == "user"]


def blobs(home):
    return sorted(p.name for p in (home / "blobs").rglob("*") if p.is_file())


async def test_an_image_and_documents_reach_the_model(store, tmp_path, slack):
    with FakeLLMServer() as llm:
        http = httpx.AsyncClient()
        model = OpenAIClient(http, base_url=llm.url + "/v1", api_key="k", model="m")
        try:
            async with SlackRig(store, tmp_path, slack, client=model,
                                max_file_bytes=5_000_000) as rig:
                photo = png(3000, 2000)
                files = [slack.add_file("whiteboard.png", photo, mimetype="image/png",
                                        filetype="png"),
                         slack.add_file("bill.pdf", pdf("Total due 99 EUR"),
                                        mimetype="application/pdf", filetype="pdf"),
                         slack.add_file("notes.docx", docx("Call the plumber"), mimetype=DOCX,
                                        filetype="docx"),
                         slack.add_file("bomb.png", png_header_only(100_000, 100_000),
                                        mimetype="image/png", filetype="png")]
                _, body = says(slack, DM, ALICE, "what do these say?", files=files)
                await rig.send(body)
                await rig.settle()
                stored_once = blobs(tmp_path)
                again = slack.add_file("whiteboard-again.png", photo, mimetype="image/png",
                                       filetype="png")
                _, body = says(slack, DM, ALICE, "and this one?", files=[again])
                await rig.send(body)
                await rig.settle()
        finally:
            await http.aclose()
        first, second = [r for r in llm.requests if r.path == "/v1/chat/completions"]

    assert [m["text"] for m in slack.bot_messages(DM)] == ["ok", "ok"]
    one, two = await user_entries(store)
    assert "[image: whiteboard.png (image/png, " in one.text
    assert "3000×2000, shown at 1568×1045]" in one.text
    assert "[document: bill.pdf (application/pdf, " in one.text
    assert "Total due 99 EUR" in one.text and "Call the plumber" in one.text
    assert "[attached file: bomb.png (image/png, " in one.text
    assert "(not read: the image declares too many pixels" in one.text
    refs = one.data[REF]
    assert [r["kind"] for r in refs] == ["image", "pdf", "docx", "unreadable"]
    # the image went to the model as an image block, downscaled, the same bytes as stored
    [(media_type, sent)] = images(first)
    blob = refs[0]["blob"]
    assert sent == (tmp_path / "blobs" / blob[:2] / blob).read_bytes()
    assert media_type == refs[0]["media_type"]
    # shared again: the same blob, stored once; both messages' images go with the context
    assert blobs(tmp_path) == stored_once
    assert two.data[REF][0]["blob"] == blob
    assert [m for m, _ in images(second)] == [media_type, media_type]
