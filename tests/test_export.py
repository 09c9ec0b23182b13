"""`steward export`: one conversation, one person's, or everything, as the JSONL that
`steward import` reads back (lossless: export -> import into a new home -> export is the
same bytes), Markdown to read, documents and attachments; streamed in bounded memory and
published atomically, private like the home. On SQLite and PostgreSQL (the `store` /
`store_url` fixtures)."""

import asyncio
import hashlib
import io
import json
import os
import stat
import sys
import tracemalloc
import uuid
from pathlib import Path

import pytest

from bot.app.export import ExportFailed, default_target, export_home, slug
from bot.app.importers import Progress, import_file
from bot.attachments.blobs import BlobStore
from bot.importers.jsonl import JsonlReader
from bot.importers.model import Item, Problem
from bot.provenance import MARK
from store import Writes, conversation_namespace, open_store
from tests.conftest import _pg_admin

T0 = 1_714_817_520.123_456_7  # 2024-05-04 10:12, below the microsecond too
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4  # bytes only: nothing reads them here
PDF = b"%PDF-1.4\n" + b"x" * 5000


def quiet():
    return Progress("test", stream=io.StringIO(), interactive=False)


@pytest.fixture
async def fresh_url(store_url, tmp_path):
    """A second empty store on the same backend as `store_url`: the new home."""
    if store_url.startswith("sqlite"):
        yield f"sqlite+aiosqlite:///{tmp_path / 'fresh.db'}"
        return
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{store_url.split('?')[0]}?schema={schema}"
    finally:
        await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


async def populate(store, home: Path) -> dict:
    """Three people's conversations with every kind of entry, tool calls and results,
    provenance marks, a summary (head marker), notes, attachments (one whose blob is
    gone), documents, facts, and a fork."""
    blobs = BlobStore.of_home(home)
    png, pdf = await blobs.put(PNG), await blobs.put(PDF)
    gone = hashlib.sha256(b"never stored").hexdigest()
    alice = await store.ensure_conversation("cli:alice", owner="alice", scope="private:alice")
    bob = await store.ensure_conversation("cli:bob", owner="bob", scope="private:bob")
    room = await store.ensure_conversation("slack:T1:C1:1700.1", owner="bob",
                                           scope="channel:C1")
    turn1, turn2, compact = "01HX0000000000000000000001", "01HX0000000000000000000002", \
        "01HX0000000000000000000003"
    calls = [{"id": "call_1", "name": "http_get", "arguments": {"url": "https://a.test/x"}}]
    w = Writes()
    w.append(alice.id, "user", "Look at this — and the PDF 📎", author="Alice",
             ref="slack-msg-1", task_id=turn1, created_at=T0, data={
                 "channel": "cli", "attachments": [
                     {"name": "photo.heic", "declared_type": "image/heic", "size": 1,
                      "kind": "image", "blob": png, "media_type": "image/png",
                      "width": 2, "height": 2},
                     {"name": "../../etc/report.pdf", "kind": "pdf", "blob": pdf},
                     {"name": "lost.png", "kind": "image", "blob": gone}]})
    w.append(alice.id, "assistant", "", task_id=turn1, created_at=T0 + 1.5,
             data={"tool_calls": calls, "answers_upto": 1})
    w.append(alice.id, "tool_result", "<html>```fenced```</html>", task_id=turn1,
             created_at=T0 + 2.25, data={"tool_call_id": "call_1", "name": "http_get",
                                         "is_error": False, "untrusted": True,
                                         MARK: "http_get"})
    w.append(alice.id, "assistant", "The page says hi.", task_id=turn1, created_at=T0 + 3,
             data={"final": True, "answers_upto": 1, "error": False, MARK: "http_get"})
    w.append(alice.id, "aborted", "The page sa", task_id="01HX00000000000000000000LL",
             created_at=T0 + 3.5, data={"reason": "Steward stopped while this reply streamed"})
    await store.commit(w)
    w = Writes()
    w.append(alice.id, "compaction", "Alice shared a photo; the page said hi.",
             task_id=compact, head=True, created_at=T0 + 60,
             data={"cut_seq": 4, "previous_cut": 0, MARK: "http_get"})
    w.append(alice.id, "user", "same time, same text", author="Alice", task_id=turn2,
             created_at=T0 + 61, data={"channel": "cli"})
    w.append(alice.id, "user", "same time, same text", author="Alice", created_at=T0 + 61,
             data=None)
    w.append(alice.id, "system", "a note\nover lines", ref="note-1", created_at=T0 + 62,
             data={"channel": "slack", "history": True})
    w.append(alice.id, "assistant", "Ünïcödé ok; NUL\x00 gone", task_id=turn2,
             created_at=T0 + 63, data={"final": True, "answers_upto": 7})
    w.edit_document(conversation_namespace(alice.id), "todo", [
        {"op": "set", "path": [], "value": {"items": [{"id": 1, "text": "buy milk",
                                                       "done": False}], "next_id": 2}}],
        initial={"items": []}, conversation_id=alice.id)
    w.edit_document("facts:private:alice", "facts", [
        {"op": "set", "path": [], "value": {"items": [{"id": 1, "text": "lives in Graz"}]}}],
        initial={"items": []})
    w.edit_document("facts:private:bob", "facts", [
        {"op": "set", "path": [], "value": {"items": [{"id": 1, "text": "likes tea"}]}}],
        initial={"items": []})
    w.edit_document("facts:channel:C1", "facts", [
        {"op": "set", "path": [], "value": {"items": [{"id": 1, "text": "standup at 9"}]}}],
        initial={"items": []})
    w.append(bob.id, "user", "bob's secret", author="Bob", ref="b1", created_at=T0 + 5)
    w.append(bob.id, "assistant", "kept", author="Steward", created_at=T0 + 6)
    w.append(room.id, "user", "hello channel", author="Bob", ref="C1:1700.1",
             created_at=T0 + 7, data={"channel": "slack"})
    await store.commit(w)
    fork = await store.fork("cli:alice", "cli:alice@5", at_seq=5)
    w = Writes()
    w.append(fork.id, "user", "in the fork", author="Alice", created_at=T0 + 100)
    await store.commit(w)
    return {"png": png, "pdf": pdf, "gone": gone}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


async def snapshot(store) -> dict:
    """Every conversation as import can bring it back: what must survive a round trip."""
    found = {}
    for conv in await store.list_conversations(limit=1000):
        page = await store.entries_page(conv.id, after=0, limit=10_000)
        found[conv.key] = {
            "owner": conv.owner, "scope": conv.scope, "last_seq": conv.last_seq,
            "head_seq": conv.head_seq,
            "entries": [(e.seq, e.kind, e.author, e.text, e.ref, e.task_id, e.data,
                         round(e.created_at * 1e6)) for e in page]}
    return found


def modes(root: Path) -> set[tuple[str, int]]:
    """(kind, permission bits) of everything under `root`, and of `root`."""
    found = {("dir", stat.S_IMODE(root.stat().st_mode))}
    for path in root.rglob("*"):
        kind = "dir" if path.is_dir() else "file"
        found.add((kind, stat.S_IMODE(path.stat().st_mode)))
    return found


# -- the round trip ----------------------------------------------------------------------


async def test_export_imports_back_into_a_new_home_as_it_was(store, fresh_url, tmp_path):
    home, new_home = tmp_path / "home", tmp_path / "new-home"
    blobs = await populate(store, home)
    first = await export_home(store, BlobStore.of_home(home), tmp_path / "first")
    # The fork holds its 5 ancestors' entries (attachments too) and one of its own.
    assert (first.conversations, first.entries, first.attachments, first.missing) == \
        (4, 19, 4, 2)
    exported = tmp_path / "first" / "conversations.jsonl"

    fresh = await open_store(fresh_url)
    try:
        report = await import_file(fresh, exported, progress=quiet(),
                                   blobs=BlobStore.of_home(new_home))
        assert (report.read, report.added, report.malformed, report.files) == (19, 19, 0, 4)
        assert await snapshot(fresh) == await snapshot(store)
        second = await export_home(fresh, BlobStore.of_home(new_home), tmp_path / "second")
        again = await import_file(fresh, exported, progress=quiet(),
                                  blobs=BlobStore.of_home(new_home))
        assert (again.added, again.duplicates) == (0, 19)  # idempotent, as any import
    finally:
        await fresh.close()
    assert (tmp_path / "second" / "conversations.jsonl").read_bytes() == exported.read_bytes()
    assert second.entries == first.entries
    for name in ("photo.heic.png", "report.pdf"):  # the bytes came along, by their names
        where = Path("attachments", slug("cli:alice"), f"000001-{name}")
        assert (tmp_path / "first" / where).read_bytes() == \
            (tmp_path / "second" / where).read_bytes()
    assert BlobStore.of_home(new_home).path(blobs["png"]).read_bytes() == PNG
    assert not BlobStore.of_home(new_home).path(blobs["gone"]).exists()


async def test_what_the_lines_hold(store, tmp_path):
    home = tmp_path / "home"
    blobs = await populate(store, home)
    await export_home(store, BlobStore.of_home(home), tmp_path / "out", session="cli:alice")
    rows = lines(tmp_path / "out" / "conversations.jsonl")
    assert [(r["seq"], r["role"]) for r in rows] == [
        (1, "user"), (2, "assistant"), (3, "tool_result"), (4, "assistant"), (5, "aborted"),
        (6, "compaction"), (7, "user"), (8, "user"), (9, "system"), (10, "assistant")]
    first = rows[0]
    assert list(first) == ["session", "seq", "role", "author", "text", "ts", "ref", "owner",
                           "scope", "task", "data", "files"]
    assert (first["session"], first["author"], first["ref"], first["owner"], first["scope"],
            first["ts"]) == ("cli:alice", "Alice", "slack-msg-1", "alice", "private:alice",
                             "2024-05-04T10:12:00.123457+00:00")
    assert first["files"] == {
        blobs["png"]: f"attachments/{slug('cli:alice')}/000001-photo.heic.png",
        blobs["pdf"]: f"attachments/{slug('cli:alice')}/000001-report.pdf"}
    assert rows[2]["data"][MARK] == "http_get"  # provenance travels with the entry
    assert "ref" not in rows[1] and rows[7]["data"] is None and "task" not in rows[7]
    # Each line reads back as the very entry (the reader's side of the format).
    items = [r for r in JsonlReader(tmp_path / "out" / "conversations.jsonl").read()]
    assert not [r for r in items if isinstance(r, Problem)]
    assert [(i.kind, i.seq, i.head, i.ref) for i in items][5:8] == [
        ("compaction", 6, True, None), ("user", 7, False, None), ("user", 8, False, None)]
    assert len({i.external_id for i in items}) == 10  # same time and text: still two


async def test_an_export_imported_into_its_own_home_adds_nothing(store, tmp_path):
    home = tmp_path / "home"
    await populate(store, home)
    await export_home(store, BlobStore.of_home(home), tmp_path / "out")
    before = await snapshot(store)
    report = await import_file(store, tmp_path / "out" / "conversations.jsonl",
                               progress=quiet(), blobs=BlobStore.of_home(home))
    assert (report.added, report.duplicates, report.malformed) == (0, 19, 0)
    assert await snapshot(store) == before


# -- what is exported ----------------------------------------------------------------------


async def test_a_person_export_holds_only_their_conversations(store, tmp_path):
    home = tmp_path / "home"
    await populate(store, home)
    report = await export_home(store, BlobStore.of_home(home), tmp_path / "alice",
                               person="alice")
    out = tmp_path / "alice"
    assert {r["session"] for r in lines(out / "conversations.jsonl")} == \
        {"cli:alice", "cli:alice@5"}
    assert report.conversations == 2
    everything = "\n".join(p.read_text() for p in out.rglob("*") if p.is_file()
                           and p.suffix in (".md", ".json", ".jsonl"))
    assert "bob's secret" not in everything and "likes tea" not in everything
    assert "hello channel" not in everything and "standup at 9" not in everything
    assert json.loads((out / "facts" / f"{slug('private:alice')}.json").read_text())[
        "value"]["items"][0]["text"] == "lives in Graz"
    assert [p.name for p in (out / "facts").iterdir()] == [f"{slug('private:alice')}.json"]

    await export_home(store, BlobStore.of_home(home), tmp_path / "bob", person="bob")
    assert {r["session"] for r in lines(tmp_path / "bob" / "conversations.jsonl")} == \
        {"cli:bob", "slack:T1:C1:1700.1"}  # private to Bob, and the thread he owns
    assert [p.name for p in (tmp_path / "bob" / "facts").iterdir()] == \
        [f"{slug('private:bob')}.json"]  # the channel's facts are the channel's


async def test_markdown_reads_like_the_conversation(store, tmp_path):
    home = tmp_path / "home"
    await populate(store, home)
    await export_home(store, BlobStore.of_home(home), tmp_path / "out",
                      timezone="Europe/Vienna")
    out = tmp_path / "out"
    text = (out / "markdown" / f"{slug('cli:alice')}.md").read_text()
    head, _, body = text.partition("\n---\n")
    assert head.splitlines()[:4] == ["# `cli:alice`", "", "- **owner:** alice",
                                     "- **scope:** `private:alice` (who may see what was "
                                     "said here)"]
    assert "- **context starts at:** entry 6 (the latest summary)" in head
    assert "### Alice · 2024-05-04 12:12:00 CEST · #1\n\nLook at this — and the PDF 📎\n" \
        in body
    assert '→ calls `http_get` with `{"url": "https://a.test/x"}`' in body
    assert "### tool result of `http_get` · 2024-05-04 12:12:02 CEST · #3" in body
    assert "````\n<html>```fenced```</html>\n````" in body  # a fence longer than the text's
    assert "*from outside text (http_get): data, not the person's words*" in body
    assert "> Alice shared a photo; the page said hi." in body
    assert "📎 lost.png (its file was missing from the home)" in body
    link = f"../attachments/{slug('cli:alice')}/000001-photo.heic.png"
    assert f"📎 [photo.heic]({link})" in body
    assert (out / "markdown" / link).resolve().read_bytes() == PNG
    fork = (out / "markdown" / f"{slug('cli:alice@5')}.md").read_text()
    assert "- **forked from:** `cli:alice` at entry 5" in fork and "in the fork" in fork
    index = (out / "index.md").read_text()
    assert f"- [`cli:bob`](markdown/{slug('cli:bob')}.md): bob, `private:bob`, 2 entries" \
        in index


async def test_documents_attachments_and_what_is_missing(store, tmp_path):
    home = tmp_path / "home"
    blobs = await populate(store, home)
    await export_home(store, BlobStore.of_home(home), tmp_path / "out")
    out = tmp_path / "out"
    todo = json.loads((out / "documents" / slug("cli:alice") / f"{slug('todo')}.json")
                      .read_text())
    assert (todo["session"], todo["name"], todo["value"]["items"][0]["text"]) == \
        ("cli:alice", "todo", "buy milk")
    # The fork has its own copy of the list, as the store keeps it.
    assert (out / "documents" / slug("cli:alice@5") / f"{slug('todo')}.json").exists()
    assert sorted(p.name for p in (out / "facts").iterdir()) == sorted(
        f"{slug(s)}.json" for s in ("private:alice", "private:bob", "channel:C1"))
    pdf = out / "attachments" / slug("cli:alice") / "000001-report.pdf"
    assert pdf.read_bytes() == PDF  # "../../etc/report.pdf": its name, nothing more
    manifest = json.loads((out / "export.json").read_text())
    assert (manifest["entries"], manifest["attachments"], manifest["missing_attachments"]) \
        == (19, 4, 2)
    assert manifest["missing_attachment_list"] == [
        {"session": key, "seq": 1, "name": "lost.png", "blob": blobs["gone"], "why": "missing"}
        for key in ("cli:alice", "cli:alice@5")]
    assert manifest["left_out"]
    assert modes(out) == {("dir", 0o700), ("file", 0o600)}


async def test_a_damaged_blob_is_reported_not_copied(store, tmp_path):
    home = tmp_path / "home"
    blobs = await populate(store, home)
    BlobStore.of_home(home).path(blobs["pdf"]).write_bytes(b"changed on disk")
    report = await export_home(store, BlobStore.of_home(home), tmp_path / "out",
                               session="cli:alice")
    assert (report.attachments, report.missing) == (1, 2)
    assert not list((tmp_path / "out").rglob("*report.pdf"))


async def test_an_entry_with_corrupt_data_is_exported_without_it(store, tmp_path):
    from sqlalchemy import update

    from store.schema import entries

    home = tmp_path / "home"
    await populate(store, home)
    bob = await store.get_conversation("cli:bob")
    async with store.engines.write.begin() as conn:  # a row damaged on disk
        await conn.execute(update(entries).where(entries.c.conversation_id == bob.id,
                                                 entries.c.seq == 1).values(data="{not json"))
    report = await export_home(store, BlobStore.of_home(home), tmp_path / "out",
                               person="bob")
    assert (report.entries, report.corrupt) == (3, 1)
    rows = lines(tmp_path / "out" / "conversations.jsonl")
    assert (rows[0]["text"], rows[0]["data"]) == ("bob's secret", None)
    [listed] = json.loads((tmp_path / "out" / "export.json").read_text())["corrupt_entry_list"]
    assert listed["session"] == "cli:bob"


# -- atomic, and refusing what it cannot do ---------------------------------------------


async def test_the_target_appears_whole_or_not_at_all(store, tmp_path):
    home = tmp_path / "home"
    await populate(store, home)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    with pytest.raises(ExportFailed, match="exists and is not an empty directory"):
        await export_home(store, BlobStore.of_home(home), taken)
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    with pytest.raises(ExportFailed, match="no conversation 'cli:nobody'"):
        await export_home(store, BlobStore.of_home(home), tmp_path / "none",
                          session="cli:nobody")
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("steward.db"))
    assert left == ["home", "taken"]  # no half-made export, no scratch directory
    empty = tmp_path / "empty"
    empty.mkdir()
    report = await export_home(store, BlobStore.of_home(home), empty, session="cli:bob")
    assert report.entries == 2 and (empty / "conversations.jsonl").exists()


def test_the_default_target_is_named_by_date(tmp_path):
    from datetime import date

    day = date(2024, 5, 4)
    assert default_target(tmp_path, day) == tmp_path / "steward-export-2024-05-04"
    (tmp_path / "steward-export-2024-05-04").mkdir()
    assert default_target(tmp_path, day) == tmp_path / "steward-export-2024-05-04-2"


# -- the import side of the format --------------------------------------------------------


@pytest.mark.parametrize("line, reason", [
    ({"seq": 0}, "seq must be a whole number from 1"),
    ({"seq": 1, "role": "tool"}, "role must be one of user, assistant, tool_result"),
    ({"role": "tool_result"}, "role must be 'user' or 'assistant'"),  # only with seq
    ({"data": [1]}, "data must be a JSON object"),
    ({"data": {"tool_calls": [{"name": "x"}]}}, "data.tool_calls must be a list"),
    ({"data": {"answers_upto": "3"}}, "data.answers_upto must be a whole number"),
    ({"task": "x" * 33}, "task must be an id of 1 to 32 characters"),
    ({"files": {"abc": "a.png"}}, "files: 'abc' is not a sha256"),
    ({"files": {"a" * 64: "../outside.png"}}, "is not a path inside the file's folder"),
    ({"files": {"a" * 64: "/etc/passwd"}}, "is not a path inside the file's folder"),
])
def test_bad_export_lines_are_problems(tmp_path, line, reason):
    path = tmp_path / "x.jsonl"
    row = {"session": "cli:x", "role": "user", "text": "t", "ts": 1.0, **line}
    path.write_text(json.dumps(row) + "\n" + json.dumps(
        {"session": "cli:x", "role": "user", "text": "fine", "ts": 1.0, "data": {"a": 1}})
        + "\n")
    found = list(JsonlReader(path).read())
    assert isinstance(found[0], Problem) and reason in found[0].reason, found[0]
    assert isinstance(found[1], Item) and found[1].data == {"a": 1}


async def test_a_file_that_does_not_match_its_sha256_is_a_problem(store, tmp_path):
    sha = hashlib.sha256(b"the real bytes").hexdigest()
    (tmp_path / "a.bin").write_bytes(b"other bytes")
    (tmp_path / "x.jsonl").write_text(json.dumps({
        "session": "cli:x", "seq": 1, "role": "user", "text": "t", "ts": 1.0,
        "data": {"attachments": [{"name": "a.bin", "blob": sha}]},
        "files": {sha: "a.bin", "b" * 64: "b.bin"}}) + "\n")
    report = await import_file(store, tmp_path / "x.jsonl", progress=quiet(),
                               blobs=BlobStore.of_home(tmp_path / "home"))
    assert (report.added, report.files) == (1, 0)
    assert [p.reason for p in report.problems] == [
        "attachment a.bin: its bytes do not match its sha256", "attachment b.bin: no such file"]


# -- bounded memory -------------------------------------------------------------------------


async def write_history(store, n: int, *, key: str = "cli:long") -> None:
    conv = await store.ensure_conversation(key, owner="alice", scope="private:alice")
    text = "a message of ordinary length, about what was said that day " * 3
    for start in range(0, n, 2000):
        w = Writes()
        for i in range(start, min(n, start + 2000)):
            w.append(conv.id, "user" if i % 2 == 0 else "assistant", f"{i} {text}",
                     author="Alice" if i % 2 == 0 else None, ref=f"r{i}",
                     created_at=T0 + i, data={"channel": "cli"})
        await store.commit(w)


async def peak_of_export(store, home: Path, target: Path) -> tuple[int, float]:
    tracemalloc.start()
    try:
        report = await export_home(store, BlobStore.of_home(home), target)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak, report.entries


async def test_an_export_of_20k_entries_takes_no_more_memory_than_of_2k(store, tmp_path):
    await write_history(store, 2_000, key="cli:short")
    small, n = await peak_of_export(store, tmp_path / "home", tmp_path / "small")
    assert n == 2_000
    await write_history(store, 18_000)
    large, n = await peak_of_export(store, tmp_path / "home", tmp_path / "large")
    assert n == 20_000
    # A page of 500 entries and its lines at a time, whatever the length of the history.
    print(f"peak {small / 1e6:.2f} MB for 2k entries, {large / 1e6:.2f} MB for 20k")
    assert large < small * 1.5 + 1_000_000, f"{small / 1e6:.1f} MB -> {large / 1e6:.1f} MB"
    assert large < 5_000_000, f"peak {large / 1e6:.1f} MB"
    assert (tmp_path / "large" / "conversations.jsonl").read_bytes().count(b"\n") == 20_000


# -- the command ---------------------------------------------------------------------------


async def steward(home: Path, *args: str, cwd: Path) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "XDG_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), XDG_CONFIG_HOME=str(home / "xdg"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=env, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_steward_export_then_steward_import_in_another_home(tmp_path):
    home, other = tmp_path / "home", tmp_path / "other"
    home.mkdir()
    other.mkdir()
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    try:
        await populate(store, home)
    finally:
        await store.close()
    code, out, err = await steward(home, "export", "--json", cwd=tmp_path)
    assert code == 0, err
    summary = json.loads(out)
    made = Path(summary["path"])
    assert made.parent == tmp_path and made.name.startswith("steward-export-")
    assert (summary["conversations"], summary["entries"]) == (4, 19)
    code, out, err = await steward(other, "import", str(made / "conversations.jsonl"),
                                   "--json", cwd=tmp_path)
    assert code == 0, err
    assert (json.loads(out)["added"], json.loads(out)["files"]) == (19, 4)
    code, out, err = await steward(other, "export", "--session", "cli:alice", "--to",
                                   "again", cwd=tmp_path)
    assert code == 0, err
    assert out.startswith(f"exported conversation cli:alice to {tmp_path / 'again'}: "
                          "1 conversations, 10 entries, 2 attachments")
    alice = [r for r in lines(made / "conversations.jsonl") if r["session"] == "cli:alice"]
    assert lines(tmp_path / "again" / "conversations.jsonl") == alice
    code, _, err = await steward(home, "export", "--to", "again", cwd=tmp_path)
    assert code == 1 and "exists and is not an empty directory" in err
    code, _, err = await steward(home, "export", "--session", "a", "--person", "b",
                                 cwd=tmp_path)
    assert code == 2 and "not allowed with argument" in err
