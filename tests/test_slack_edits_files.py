"""Edits and deletions of the user's message, and files shared with Steward."""

import asyncio

from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response
from tests.fakes.slack_events import deleted, edited, says
from tests.fakes.slack_rig import SlackRig, last_user_text
from tests.fakes.slack_server import TEAM

DM = "D0ALICE"
ALICE = "U0ALICE"
KEY = f"slack:{TEAM}:{DM}"


def gated_model(gate: asyncio.Event) -> ScriptedModel:
    """Echoes the user's messages since its last answer, once `gate` is open."""
    async def answer(request):
        await gate.wait()
        said = []
        for m in reversed(request.messages):
            if m.role == "assistant":
                break
            if m.role == "user":
                said.insert(0, m.content)
        return Response(text="echo: " + " | ".join(said))
    return ScriptedModel(answer)


async def entries(store):
    conv = await store.get_conversation(KEY)
    return [(e.kind, e.text) for e in await store.entries_page(conv.id, limit=100)]


async def test_an_edit_before_the_answer_is_answered_with_it(store, tmp_path, slack):
    gate = asyncio.Event()
    async with SlackRig(store, tmp_path, slack, client=gated_model(gate)) as rig:
        message, body = says(slack, DM, ALICE, "book a table for 2")
        await rig.send(body)
        await asyncio.sleep(0.3)  # the turn is waiting on the model
        await rig.send(edited(slack, DM, message["ts"], "book a table for 4"))
        await asyncio.sleep(0.3)
        gate.set()
        await rig.settle()
    log = await entries(store)
    assert [t for k, t in log if k == "user"] == ["book a table for 2",
                                                  "(edited) book a table for 4"]
    answers = [m["text"] for m in slack.bot_messages(DM)]
    assert answers[-1].endswith("(edited) book a table for 4")
    assert 1 <= len(answers) <= 2  # the follow-up may be answered with the original


async def test_an_edit_after_the_answer_is_a_note_not_a_new_question(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        message, body = says(slack, DM, ALICE, "what is 2+2")
        await rig.send(body)
        await rig.settle()
        await rig.send(edited(slack, DM, message["ts"], "what is 2+3"))
        await rig.settle()
    assert len(slack.bot_messages(DM)) == 1
    assert (await entries(store))[-1] == (
        "user", "(edited an earlier message; it now says:) what is 2+3")


async def test_a_deleted_question_is_not_answered(store, tmp_path, slack):
    gate = asyncio.Event()
    async with SlackRig(store, tmp_path, slack, client=gated_model(gate)) as rig:
        message, body = says(slack, DM, ALICE, "my password is hunter2")
        await rig.send(body)
        await asyncio.sleep(0.3)
        await rig.send(deleted(slack, DM, message["ts"]))
        await asyncio.sleep(0.3)
        gate.set()
        await rig.settle()
    assert slack.bot_messages(DM) == []
    log = await entries(store)
    assert log[1] == ("user", "(deleted an earlier message, which said: my password is hunter2)")
    deliveries = await store.list_tasks(kind="deliver")
    assert [d.result.get("skipped") for d in deliveries] == ["the question was deleted"]


async def test_deleting_an_answered_message_keeps_the_answer(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack) as rig:
        message, body = says(slack, DM, ALICE, "hello")
        await rig.send(body)
        await rig.settle()
        await rig.send(deleted(slack, DM, message["ts"]))
        await rig.settle()
    assert [m["text"] for m in slack.bot_messages(DM)] == ["echo: hello"]
    assert (await entries(store))[-1][1].startswith("(deleted an earlier message")


async def test_text_files_are_read_and_others_listed(store, tmp_path, slack):
    model = ScriptedModel(lambda r: Response(text=f"got {len(last_user_text(r))} chars"))
    async with SlackRig(store, tmp_path, slack, client=model, max_file_bytes=1000) as rig:
        notes = slack.add_file("notes.txt", b"milk\neggs\n")
        photo = slack.add_file("cat.png", b"\x89PNG\x00\x01", mimetype="image/png",
                               filetype="png")
        tool = slack.add_file("tool.bin", b"\x7fELF\x00", mimetype="application/octet-stream",
                              filetype="binary")
        big = slack.add_file("big.log", b"x" * 5000)
        _, body = says(slack, DM, ALICE, "see attached", files=[notes, photo, tool, big])
        await rig.send(body)
        await rig.settle()
    (kind, text), _ = await entries(store)
    # (a real image is shown to the model: tests/test_attachments_slack.py)
    assert text == ("see attached\n\n"
                    "[attached file: notes.txt (text/plain, 10 bytes)]\nmilk\neggs\n\n"
                    "[end of notes.txt]\n\n"
                    "[attached file: cat.png (image/png, 6 bytes)] "
                    "(not read: its content is not an image Steward can read)\n\n"
                    "[attached file: tool.bin (application/octet-stream, 5 bytes)] "
                    "(not a text file; not read)"
                    "\n\n[attached file: big.log (text/plain, 5000 bytes)] "
                    "(larger than the 1000-byte limit; not read)")
    # the text file and the image within the limit; never the unknown binary
    assert slack.count("files.download") == 2


async def test_a_file_whose_size_lies_is_cut_off_at_the_limit(store, tmp_path, slack):
    async with SlackRig(store, tmp_path, slack, max_file_bytes=100) as rig:
        liar = {**slack.add_file("small.txt", b"y" * 10_000), "size": 10}
        _, body = says(slack, DM, ALICE, "read this", files=[liar])
        await rig.send(body)
        await rig.settle()
    (_, text), _ = await entries(store)
    assert text.endswith("(larger than the 100-byte limit; not read)")
