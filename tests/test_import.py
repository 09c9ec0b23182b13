"""`steward import`: JSONL, Slack export and mbox brought into the store, streaming,
idempotent, with malformed records reported and skipped. Every test runs on SQLite and on
PostgreSQL (the `store` / `store_url` fixtures)."""

import asyncio
import io
import json
import re
import shutil
import subprocess
import sys
import tracemalloc
import zipfile
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from bot.app.config import build_config
from bot.app.importers import (
    ImportFailed,
    Progress,
    guess_format,
    import_command,
    import_file,
)
from bot.importers import writer as writer_module
from bot.importers.jsonl import JsonlReader
from store import NotFound, Writes, open_store

SAMPLES = Path(__file__).parent / "import_samples"


def quiet():
    return Progress("test", stream=io.StringIO(), interactive=False)


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


async def entries(store, key):
    conv = await store.get_conversation(key)
    return conv, await store.entries_page(conv.id, limit=1000)


def append_lines(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def zip_folder(folder: Path, target: Path, *, top: str = "") -> Path:
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                z.write(path, top + path.relative_to(folder).as_posix())
    return target


# -- JSONL ---------------------------------------------------------------------------


async def test_jsonl_end_to_end(store):
    report = await import_file(store, SAMPLES / "history.jsonl", progress=quiet())
    assert (report.format, report.read, report.added, report.duplicates) == ("jsonl", 4, 4, 0)
    assert report.malformed == 6
    assert [(p.where, p.reason.split(":")[0]) for p in report.problems] == [
        ("line 6", "not JSON"),
        ("line 7", "missing session"),
        ("line 8", "role must be 'user' or 'assistant', not 'system'"),
        ("line 9", "ts 'yesterday' is not ISO-8601"),
        ("line 10", "text must be a string"),
        ("line 11", "not a JSON object"),
    ]

    conv, notes = await entries(store, "cli:notes")
    assert conv.scope == "private:local"  # like a terminal session
    assert [(e.seq, e.kind, e.author, e.text, e.ref) for e in notes] == [
        (1, "user", "ann", "my sister lives in Graz", "n1"),
        (2, "assistant", "Steward", "Noted: Graz.", "n2"),
        (3, "user", "ann", "no ref on this one", notes[2].ref),
    ]
    assert notes[2].ref.startswith("jsonl:")  # derived, stable
    assert [e.created_at for e in notes] == [ts("2021-03-04T10:00:00"),
                                             ts("2021-03-04T10:00:05"),
                                             ts("2021-03-04T10:01:00")]  # no zone: UTC
    conv, other = await entries(store, "cli:other")
    assert (conv.owner, conv.scope) == ("ann", "private:ann")
    # the same ref in another session is another message
    assert [(e.text, e.ref, e.created_at, e.author) for e in other] == [
        ("unix seconds work too", "n1", 1614852000.0, None)]


async def test_jsonl_twice_adds_nothing_and_an_extended_file_only_the_new_lines(
        store, tmp_path):
    path = tmp_path / "h.jsonl"
    shutil.copy(SAMPLES / "history.jsonl", path)
    await import_file(store, path, progress=quiet())
    again = await import_file(store, path, progress=quiet())
    assert (again.read, again.added, again.duplicates) == (4, 0, 4)

    append_lines(path, [
        {"session": "cli:notes", "role": "user", "text": "one more", "ts": "2021-03-05T09:00:00Z"},
        {"session": "cli:new", "role": "user", "text": "elsewhere", "ts": "2021-03-05T09:00:01Z",
         "ref": "x"}])
    extended = await import_file(store, path, progress=quiet())
    assert (extended.read, extended.added, extended.duplicates) == (6, 2, 4)
    _, notes = await entries(store, "cli:notes")
    assert [e.text for e in notes][-2:] == ["no ref on this one", "one more"]
    assert [e.text for e in (await entries(store, "cli:new"))[1]] == ["elsewhere"]


async def test_a_message_repeated_inside_one_batch_is_stored_once(store, tmp_path):
    line = json.dumps({"session": "cli:r", "role": "user", "text": "same",
                       "ts": "2022-01-01T00:00:00Z"})
    path = tmp_path / "r.jsonl"
    path.write_text(f"{line}\n{line}\n{line.replace('same', 'other')}\n")
    report = await import_file(store, path, progress=quiet())
    assert (report.read, report.added, report.duplicates) == (3, 2, 1)
    assert [e.text for e in (await entries(store, "cli:r"))[1]] == ["same", "other"]


async def test_batches_that_mix_new_and_known_messages(store, tmp_path):
    lines = [json.dumps({"session": f"cli:b{i % 3}", "role": "user", "text": f"m{i}",
                         "ts": 1_600_000_000 + i, "ref": f"r{i}"}) for i in range(50)]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(lines[::2]) + "\n")  # every other one first
    first = await import_file(store, path, progress=quiet(), chunk=7)
    assert first.added == 25
    path.write_text("\n".join(lines) + "\n")
    second = await import_file(store, path, progress=quiet(), chunk=7)
    assert (second.added, second.duplicates) == (25, 25)
    total = 0
    for k in range(3):
        conv = await store.get_conversation(f"cli:b{k}")
        total += conv.last_seq
    assert total == 50


async def test_two_imports_of_one_file_at_once_store_each_message_once(store, tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"session": "cli:c", "role": "user", "text": f"m{i}",
                                        "ts": 1_600_000_000 + i}) + "\n" for i in range(120)))
    a, b = await asyncio.gather(import_file(store, path, progress=quiet(), chunk=10),
                                import_file(store, path, progress=quiet(), chunk=10))
    assert a.added + b.added == 120
    assert a.added + a.duplicates == b.added + b.duplicates == 120
    conv, page = await entries(store, "cli:c")
    assert conv.last_seq == 120
    assert sorted(e.text for e in page) == sorted(f"m{i}" for i in range(120))


async def test_an_overlong_line_is_reported_not_read_whole(tmp_path):
    path = tmp_path / "long.jsonl"
    good = json.dumps({"session": "s", "role": "user", "text": "ok", "ts": 1})
    path.write_text(good + "\n" + "x" * 5000 + "\n" + good.replace("ok", "ok2") + "\n")
    records = list(JsonlReader(path, max_line=1024).read())
    assert [getattr(r, "text", None) for r in records] == ["ok", None, "ok2"]
    assert (records[1].where, records[1].reason) == ("line 2", "line longer than 1024 bytes")


async def test_text_the_databases_would_refuse_is_cleaned(store, tmp_path):
    path = tmp_path / "nul.jsonl"
    path.write_text(json.dumps({"session": "cli:nul", "role": "user", "ts": 1,
                                "text": "a\u0000b \ud800c", "author": "x" * 400}) + "\n")
    report = await import_file(store, path, progress=quiet())
    assert (report.added, report.malformed) == (1, 0)
    [entry] = (await entries(store, "cli:nul"))[1]
    assert entry.text == "ab ?c"
    assert len(entry.author) == 256


async def test_odd_values_stop_only_their_own_record(store, tmp_path):
    path = tmp_path / "odd.jsonl"
    rows = [{"session": "cli:o", "role": "user", "text": "inf", "ts": 1e400},
            {"session": "cli:o", "role": "user", "text": "huge", "ts": 10 ** 400},
            {"session": "cli:o", "role": "user", "text": "ref", "ts": 1, "ref": {"a": 1}},
            {"session": "cli:o", "role": "user", "text": "fine", "ts": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows).replace("Infinity", "1e400"))
    report = await import_file(store, path, progress=quiet())
    assert report.added == 1
    assert [p.reason for p in report.problems] == [
        "ts is not a plausible unix time", "ts is not a plausible unix time",
        "ref must be a non-empty string"]

    folder = tmp_path / "odd_export"
    (folder / "C0ODDONE").mkdir(parents=True)
    (folder / "C0ODDONE" / "2020-01-01.json").write_text(json.dumps([
        {"type": "message", "bot_id": "B1", "bot_profile": "not a dict", "text": "t",
         "ts": "1.0"},
        {"type": "message", "user": "U1", "text": "kept", "ts": "2.0", "files": "nope"}]))
    report = await import_file(store, folder, progress=quiet())
    assert report.added == 1
    assert report.problems[0].reason.startswith("AttributeError: ")


# -- Slack ---------------------------------------------------------------------------


@pytest.fixture(params=["zip", "folder", "zip-in-a-folder"])
def slack_export(request, tmp_path):
    folder = SAMPLES / "slack_export"
    if request.param == "folder":
        return folder
    return zip_folder(folder, tmp_path / "export.zip",
                      top="Acme Slack export/" if request.param == "zip-in-a-folder" else "")


async def test_slack_export_end_to_end(store, slack_export):
    # a live DM conversation exists already: imported history joins it
    live = await store.ensure_conversation("slack:T0ACME:D0DM1", owner="slack:T0ACME:U0ANN",
                                           scope="private:slack:T0ACME:U0ANN")
    report = await import_file(store, slack_export, progress=quiet())
    assert report.format == "slack"
    assert (report.read, report.added) == (10, 10)
    assert dict(report.skipped) == {"channel_join": 1, "empty": 1}
    assert sorted((p.where, p.reason.split(":")[0]) for p in report.problems) == [
        ("general/2024-01-01.json message 6", "not a JSON object"),
        ("general/2024-01-01.json message 7", "missing ts"),
        ("general/2024-01-03.json", "not JSON"),
    ]

    conv, top = await entries(store, "slack:T0ACME:C0GENERAL")
    assert conv.scope == "channel:C0GENERAL"
    assert [(e.kind, e.author, e.text, e.ref, e.created_at) for e in top] == [
        ("user", "Ann Example", "hello & welcome @Bobby", "C0GENERAL:1704103260.000200",
         1704103260.0002),
        ("user", "Bobby", "[file: Q1 plan]", "C0GENERAL:1704189600.000100", 1704189600.0001),
    ]
    conv, thread = await entries(store, "slack:T0ACME:C0GENERAL:1704103320.000300")
    assert conv.scope == "channel:C0GENERAL"
    assert [(e.kind, e.author, e.text) for e in thread] == [
        ("user", "Ann Example", "who knows the VPN?"),  # the parent opens its thread
        ("user", "Bobby", "it rotates monthly"),
        ("assistant", "Steward", "see #general pins"),
    ]

    conv, dm = await entries(store, "slack:T0ACME:D0DM1")
    assert conv.id == live.id
    assert [(e.kind, e.author, e.text) for e in dm] == [
        ("user", "Ann Example", "remind me to call mum"), ("assistant", "Steward", "Will do.")]
    conv, dm_thread = await entries(store, "slack:T0ACME:D0DM1:1704110400.000100")
    assert (conv.owner, conv.scope) == ("slack:T0ACME:U0ANN", "private:slack:T0ACME:U0ANN")
    assert [e.text for e in dm_thread] == ["in a DM thread"]

    for key, scope, text in (("slack:T0ACME:G0OPS", "channel:G0OPS", "private channel talk"),
                             ("slack:T0ACME:G0MPIM", "channel:G0MPIM", "group dm")):
        conv, page = await entries(store, key)
        assert (conv.scope, [e.text for e in page]) == (scope, [text])

    again = await import_file(store, slack_export, progress=quiet())
    assert (again.read, again.added, again.duplicates) == (10, 0, 10)


async def test_slack_messages_the_connector_took_in_are_not_imported_again(store, tmp_path):
    live = await store.ensure_conversation("slack:T0ACME:D0DM1", owner="slack:T0ACME:U0ANN")
    w = Writes()  # as connectors/slack/inbound.py records them: "<channel>:<ts>"
    w.submit("slack", "Ev1", "D0DM1:1704110400.000100", conversation_id=live.id)
    w.append(live.id, "user", "remind me to call mum", author="Ann Example")
    w.submit("slack:history", "D0DM1:1704110410.000300", conversation_id=live.id)
    await store.commit(w)
    report = await import_file(store, SAMPLES / "slack_export", progress=quiet())
    assert (report.added, report.duplicates) == (8, 2)
    _, dm = await entries(store, "slack:T0ACME:D0DM1")
    assert [e.text for e in dm] == ["remind me to call mum", "Will do."]
    assert dm[1].data == {"slack": {"channel": "D0DM1", "ts": "1704110405.000200",
                                    "user": "U0BOT", "thread_ts": None}, "import": "slack"}
    with pytest.raises(NotFound):
        await store.get_conversation("slack:T0ACME:D0DM1:1704110400.000100")


async def test_slack_export_without_a_team_id_or_channel_lists(store, tmp_path):
    folder = tmp_path / "bare"
    (folder / "C0RANDOM").mkdir(parents=True)
    (folder / "misc").mkdir()
    (folder / "users.json").write_text(json.dumps([{"id": "U1", "name": "ann"}]))
    (folder / "C0RANDOM" / "2020-05-01.json").write_text(json.dumps(
        [{"type": "message", "user": "U1", "text": "hi <@U2|zed>", "ts": "1588291200.1"}]))
    (folder / "misc" / "2020-05-01.json").write_text(json.dumps(
        [{"type": "message", "user": "U1", "text": "where am I", "ts": "1588291300.1"}]))
    report = await import_file(store, zip_folder(folder, tmp_path / "bare.zip"),
                               progress=quiet())
    assert report.added == 2
    assert [p.where for p in report.problems] == ["misc"]  # imported, with a note
    conv, page = await entries(store, "slack:T0:C0RANDOM")
    assert (conv.scope, page[0].author, page[0].text) == ("channel:C0RANDOM", "ann", "hi @zed")
    assert (await store.get_conversation("slack:T0:misc")).scope == "channel:misc"


async def test_a_damaged_member_is_reported_and_the_others_imported(store, tmp_path):
    path = tmp_path / "damaged.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for day, text in (("01", "first day"), ("02", "SECOND DAY"), ("03", "third day")):
            z.writestr(f"C0DAMAGED/2020-01-{day}.json", json.dumps(
                [{"type": "message", "user": "U1", "text": text, "ts": f"15778{day}000.1"}]))
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"SECOND DAY", b"SECOND DAX"))  # its CRC no longer fits
    report = await import_file(store, path, progress=quiet())
    assert report.added == 2
    assert [(p.where, p.reason.split(":")[0]) for p in report.problems] == [
        ("C0DAMAGED/2020-01-02.json", "unreadable")]


async def test_a_damaged_zip_is_a_clear_error(store, tmp_path):
    path = tmp_path / "broken.zip"
    path.write_bytes(b"PK\x03\x04 this is no zip at all")
    with pytest.raises(ImportFailed, match="broken.zip"):
        await import_file(store, path, progress=quiet())


# -- mbox ----------------------------------------------------------------------------


async def test_mbox_end_to_end(store):
    # the email connector took one of these in already: it is not imported again
    live = await store.ensure_conversation("email:html-1@example.net", owner="bob@example.net")
    w = Writes()
    w.submit("email", "msgid:html-1@example.net", conversation_id=live.id)
    w.append(live.id, "user", "Subject: html only\n\n(live)", author="bob@example.net")
    await store.commit(w)

    report = await import_file(store, SAMPLES / "mail.mbox", progress=quiet(),
                               owner_address="Steward@Home.example")
    assert (report.format, report.read, report.added, report.duplicates) == ("mbox", 6, 5, 1)
    [problem] = report.problems
    assert problem.where.startswith("message 5 at byte ") and problem.reason == "empty message"

    conv, thread = await entries(store, "email:root-1@example.org")
    assert (conv.owner, conv.scope) == ("ann@example.org", "private:ann@example.org")
    assert [(e.kind, e.author, e.ref) for e in thread] == [
        ("user", "ann@example.org", "msgid:root-1@example.org"),
        ("assistant", "steward@home.example", "msgid:reply-1@home.example"),
        ("user", "ann@example.org", "msgid:late-1@example.org"),
    ]
    # the email connector's rendering: subject, then the body
    assert thread[0].text == ("Subject: Grüße from Graz\n\nHello Steward,\n"
                              "my sister lives in Graz.\nFrom here on, an escaped From line.")
    assert thread[0].data["email"]["from_name"] == "Ann Example"
    assert thread[0].data["import"] == "mbox"
    assert "From now on I will remember it" in thread[1].text  # not a new message
    assert [e.created_at for e in thread] == [ts("2021-03-01T09:00:00"),
                                              ts("2021-03-01T09:05:00"),
                                              ts("2021-03-03T08:00:00")]  # From_ line

    # someone else's mail in Ann's thread is not Ann's to see: a thread of its own
    conv, [dave] = await entries(store, "email:root-1@example.org/from:dave@example.org")
    assert (conv.owner, conv.scope) == ("dave@example.org", "private:dave@example.org")
    assert dave.text == "Subject: Re: Gruesse from Graz\n\nDave here, in Ann's thread."

    _, page = await entries(store, "email:html-1@example.net")
    assert [e.text for e in page] == ["Subject: html only\n\n(live)"]

    conv, [orphan] = await entries(store, "email:somewhere@else")  # In-Reply-To is the root
    assert conv.scope == "private:carol@example.com"
    assert orphan.ref.startswith("sha256:")
    assert orphan.text == "Subject: only in-reply-to\n\nNo Message-ID here."

    again = await import_file(store, SAMPLES / "mail.mbox", progress=quiet(),
                              owner_address="steward@home.example")
    assert (again.added, again.duplicates) == (0, 6)


async def test_mbox_html_and_attachments(store, tmp_path):
    path = tmp_path / "one.mbox"
    raw = (SAMPLES / "mail.mbox").read_bytes()
    start = raw.index(b"From bob@example.net")
    path.write_bytes(raw[start:raw.index(b"From ann@example.org Wed")])
    report = await import_file(store, path, progress=quiet())
    assert report.added == 1
    _, [html] = await entries(store, "email:html-1@example.net")
    assert html.text == ("Subject: html only\n\nCafé at noon?\n\nBob & co\n\n"
                         "[Attachment: menu.pdf (application/pdf, 9 bytes)]")
    assert html.data["email"]["attachments"] == [
        {"filename": "menu.pdf", "content_type": "application/pdf", "size": 9,
         "document": None, "omitted": "not stored by the import"}]


async def test_mbox_thread_started_by_the_owner_belongs_to_the_recipient(store, tmp_path):
    path = tmp_path / "sent.mbox"
    path.write_bytes(
        b"garbage before any From line\n\n"
        b"From me@home.example Mon Jan  4 10:00:00 2021\n"
        b"From: me@home.example\nTo: Dan <dan@example.org>\nMessage-ID: <out-1@home.example>\n"
        b"Date: Mon, 04 Jan 2021 10:00:00 +0000\nSubject: hi\n\nHello Dan\n")
    report = await import_file(store, path, "mbox", progress=quiet(),
                               owner_address="me@home.example")
    assert report.added == 1
    assert [p.reason for p in report.problems] == ["data before the first 'From ' line skipped"]
    conv, [entry] = await entries(store, "email:out-1@home.example")
    assert (conv.scope, entry.kind, entry.text) == ("private:dan@example.org", "assistant",
                                                    "Subject: hi\n\nHello Dan")


# -- guessing, the command, progress -------------------------------------------------


async def test_format_is_guessed_from_the_extension_or_the_content(tmp_path):
    assert guess_format(SAMPLES / "history.jsonl") == "jsonl"
    assert guess_format(SAMPLES / "mail.mbox") == "mbox"
    assert guess_format(SAMPLES / "slack_export") == "slack"
    for source, expected in ((SAMPLES / "history.jsonl", "jsonl"),
                             (SAMPLES / "mail.mbox", "mbox"),
                             (zip_folder(SAMPLES / "slack_export", tmp_path / "e.zip"), "slack")):
        bare = tmp_path / f"export-{expected}"
        shutil.copy(source, bare)
        assert guess_format(bare) == expected
    (tmp_path / "notes.txt").write_text("just some text\n")
    with pytest.raises(ImportFailed, match="pass --format"):
        guess_format(tmp_path / "notes.txt")


async def test_import_command(store_url, tmp_path, capsys):
    config = build_config({"store": {"url": store_url}}, home=tmp_path)
    args = SimpleNamespace(file=str(SAMPLES / "history.jsonl"), format=None, json=True)
    assert await import_command(config, args) == 1  # malformed lines: imported, yet exit 1
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert (result["format"], result["added"], result["malformed"]) == ("jsonl", 4, 6)
    assert result["problems"][0] == {"where": "line 6", "reason": result["problems"][0]["reason"]}
    # stderr is not a terminal here: no bar, the problems, the summary and why it failed
    lines = err.splitlines()
    assert lines[0].startswith("  line 6: not JSON")
    assert lines[-2].startswith("imported 4 new entries from ")
    assert lines[-1] == "steward: 6 malformed lines skipped; imported the rest (4 new)"
    assert "\r" not in err and "\x1b" not in err
    # the second time the same lines are malformed again: still 1, nothing new
    assert await import_command(config, args) == 1
    out, err = capsys.readouterr()
    assert (json.loads(out)["added"], err.splitlines()[-1]) == (
        0, "steward: 6 malformed lines skipped; imported the rest (0 new)")

    dry = SimpleNamespace(file=str(SAMPLES / "mail.mbox"), format="mbox", json=False,
                          dry_run=True)
    assert await import_command(config, dry) == 1  # one of its messages is empty
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines()[-2].startswith("would import 6 new entries")
    assert err.splitlines()[-1] == ("steward: 1 malformed message skipped; would import the "
                                    "rest (6 new)")
    store = await open_store(store_url)
    try:
        with pytest.raises(NotFound):
            await store.get_conversation("email:root-1@example.org")
    finally:
        await store.close()

    with pytest.raises(ImportFailed, match="no such file"):
        await import_command(config, SimpleNamespace(file=str(tmp_path / "nope.jsonl"),
                                                     format=None, json=False))
    with pytest.raises(ImportFailed, match="unknown format"):
        await import_command(config, SimpleNamespace(file=str(SAMPLES / "history.jsonl"),
                                                     format="csv", json=False))


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def frames(output: str) -> list[str]:
    """The lines a live display drew, each from the start of its line (`\\r`, erase)."""
    return [ANSI.sub("", f) for f in output.split("\r\x1b[2K")[1:]]


def test_progress_bar_redraws_at_most_ten_times_a_second():
    now = [0.0]
    out = io.StringIO()
    bar = Progress("importing x", stream=out, interactive=True, clock=lambda: now[0],
                   width=100)
    for t, n in ((0.0, 0), (0.05, 500), (0.09, 1000), (0.2, 1500), (0.25, 2000), (1.0, 4000)):
        now[0] = t
        bar.update(read=n, added=n, bad=0, position=n, total=8000)
    drawn = [f for f in frames(out.getvalue()) if " read, " in f]
    assert len(drawn) == 3  # at 0.0, 0.2 and 1.0 s
    last = drawn[-1].rstrip("\n")
    assert last.startswith("importing x ") and " 50% " in last
    assert last.endswith("4,000 read, 4,000 new, 0 bad, 4,000/s")
    assert "\n" not in out.getvalue()  # redrawn in place, never a new line per update
    bar.finish("done", ["  line 3: bad"])
    # the bar is taken off the screen (a transient display) and the cursor given back,
    # then the details and the summary are written below where it was
    assert out.getvalue().endswith("\x1b[?25h\r\x1b[1A\x1b[2K  line 3: bad\ndone\n")

    silent = io.StringIO()
    bar = Progress("x", stream=silent, interactive=False)
    bar.update(read=1, added=1, bad=0, position=1, total=2)
    bar.finish("summary")
    assert silent.getvalue() == "summary\n"


@pytest.mark.parametrize("width", [80, 60, 40])
def test_progress_bar_fits_the_terminal(width):
    now = [0.0]
    out = io.StringIO()
    bar = Progress("importing a-very-long-file-name-from-the-old-server-2019.jsonl (jsonl)",
                   stream=out, interactive=True, clock=lambda: now[0], width=width)
    for n in range(1, 6):
        now[0] = n
        bar.update(read=n * 100_000, added=n * 99_999, bad=n * 1000, position=n,
                   total=5 if n > 2 else None)  # the size known or not
    bar.close()
    drawn = [f.rstrip("\r\n") for f in frames(out.getvalue())]
    assert len([f for f in drawn if "read" in f]) == 6  # each update, and once at the end
    assert max(len(f) for f in drawn) <= width
    assert out.getvalue().count("\n") == 1  # the one the display takes back when it stops
    if width >= 80:  # wide enough: the counts are there in full, and a bar
        assert drawn[-1].endswith(" 100% 500,000 read, 499,995 new, 5,000 bad, 100,000/s")
        assert "━━━" in drawn[-1]


def test_rich_is_imported_only_when_a_bar_is_shown():
    code = ("import io, sys\n"
            "import bot.app.cli\n"
            "from bot.app.importers import Progress\n"
            "quiet = Progress('x', stream=io.StringIO())\n"
            "quiet.update(read=1, added=1, bad=0, position=1, total=2)\n"
            "quiet.finish('done')\n"
            "assert 'rich' not in sys.modules, 'rich loaded without a bar'\n"
            "shown = Progress('x', stream=io.StringIO(), interactive=True, width=80)\n"
            "shown.update(read=1, added=1, bad=0, position=1, total=2)\n"
            "shown.finish('done')\n"
            "assert 'rich' in sys.modules\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).parent.parent, timeout=60)
    assert done.returncode == 0, done.stderr


# -- streaming -----------------------------------------------------------------------


def write_history(path: Path, lines: int) -> None:
    with open(path, "w") as f:
        for i in range(lines):
            f.write(json.dumps({
                "session": f"cli:s{i % 1000}", "role": "user" if i % 2 else "assistant",
                "author": "me", "text": f"message {i} " + "lorem ipsum dolor sit amet " * 3,
                "ts": 1_500_000_000 + i, "ref": f"r{i}"}) + "\n")


async def test_the_conversation_cache_stays_bounded(store, tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "CONVERSATION_CACHE", 3)
    path = tmp_path / "many.jsonl"
    path.write_text("".join(json.dumps({"session": f"cli:k{i % 10}", "role": "user",
                                        "text": f"m{i}", "ts": i}) + "\n" for i in range(40)))
    writer = writer_module.BatchWriter(store, "import:jsonl")
    items = list(JsonlReader(path).read())
    result = await writer.write(items)
    assert (result.added, len(writer._conversations)) == (40, 3)
    for k in range(10):
        assert (await store.get_conversation(f"cli:k{k}")).last_seq == 4


MEASURE_RSS = """
import asyncio, json, sys
from bot.app.importers import Progress, import_file
from store import open_store

def status_kb(field):  # VmHWM is this process's own peak (ru_maxrss would count the
    with open("/proc/self/status") as f:  # forking parent's pages too)
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

async def main(url, path):
    store = await open_store(url)
    before = status_kb("VmRSS")
    try:
        report = await import_file(store, path, progress=Progress("x", interactive=False),
                                   dry_run=True)
    finally:
        await store.close()
    peak = status_kb("VmHWM")
    print(json.dumps({"read": report.read, "added": report.added,
                      "malformed": report.malformed, "grew_kb": peak - before}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_200k_line_file_streams_in_bounded_memory(store_url, tmp_path):
    """The whole pipeline but the commits (a dry run: read, parse, validate, chunk, ask
    the store which ids are known), in a process of its own whose peak RSS is measured:
    the file is ~30 MB, its 200k parsed lines would be several times that."""
    path = tmp_path / "big.jsonl"
    await asyncio.to_thread(write_history, path, 200_000)
    assert path.stat().st_size > 30_000_000
    store = await open_store(store_url)  # create the tables first
    await store.close()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", MEASURE_RSS, store_url, str(path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).parent.parent)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    assert (result["read"], result["added"], result["malformed"]) == (200_000, 200_000, 0)
    assert result["grew_kb"] < 50_000, f"peak RSS grew by {result['grew_kb'] / 1e3:.1f} MB"


@pytest.mark.slow
async def test_a_200k_line_import_into_the_store_in_bounded_memory(store, tmp_path):
    path = tmp_path / "big.jsonl"
    await asyncio.to_thread(write_history, path, 200_000)
    tracemalloc.start()
    try:
        report = await import_file(store, path, progress=quiet())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (report.added, report.malformed) == (200_000, 0)
    assert peak < 50_000_000, f"peak {peak / 1e6:.1f} MB"
