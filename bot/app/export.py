"""`steward export [--session KEY | --person ID] [--to PATH]`: the owner's data, out.

    PATH/                                  (default: ./steward-export-<date>)
      conversations.jsonl                  every entry, as the lines `steward import` reads
      index.md                             what is here; a line per conversation
      markdown/<conversation>.md           each conversation to read
      documents/<conversation>/<name>.json its documents (to-do list, files it was given)
      facts/<scope>.json                   what Steward remembers, per scope
      attachments/<conversation>/<seq>-<name>  the files people shared (from <home>/blobs)
      export.json                          what is here, what is missing, what is left out

What: one conversation (`--session`), one person's (`--person`: every conversation
private to them, `private:<ID>`, or owned by them; the facts of their private scope, not
a shared channel's), or everything. The JSONL lines are `bot.importers.jsonl.export_line`:
an export imports back into a new home as it was, entries, authors, times (to the
microsecond), refs, turns, data (tool calls, provenance marks), owners, scopes, the head
marker and the attachments' bytes; `export.json` says what does not (`LEFT_OUT`).

Streamed: conversations are read a page at a time in the order they were made, and each
transcript `PAGE` entries at a time (`store/exports.py`); each page is written (JSONL,
Markdown, attachments) in a thread, so memory does not grow with the history and the
event loop never waits on a file. Atomic: everything is written into a hidden directory
beside PATH, fsynced, and renamed to PATH at the end; a failure removes it. Directories
are 0700 and files 0600, like the home's.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote
from zoneinfo import ZoneInfo

from bot.app import export_markdown as md
from bot.attachments.blobs import BlobStore
from bot.attachments.keep import REF
from bot.importers.jsonl import export_line, iso
from bot.memory.facts import namespace as facts_namespace
from store import NotFound, Store, conversation_namespace
from store import exports as reads
from store.durable import fsync_path

PAGE = 500  # entries read (and written) at a time
CONVERSATION_PAGE = 100
LISTED = 100  # missing attachments and corrupt entries named in export.json; the rest counted
CHUNK = 1 << 20  # bytes copied at a time
FACTS = "facts:"
FORMAT_VERSION = 1
LEFT_OUT = [
    "tasks, deliveries, submissions, schedules and the usage ledger: the work Steward did, "
    "not what was said (a new home starts with none pending)",
    "a fork's link to the conversation it was forked from: it is exported (and imports) as "
    "a conversation of its own holding its ancestors' entries up to the fork point",
    "documents' history (only each document's newest version is in documents/ and facts/, "
    "as JSON to read; the import does not bring documents back)",
    "conversations without any entry (in index.md and markdown/ only)",
    "the conversation rows' own times (each entry keeps its time)",
]
_UNSAFE = re.compile(r"[^\w.\-]+")
_IMAGE_SUFFIX = {"image/jpeg": (".jpg", ".jpeg"), "image/png": (".png",),
                 "image/webp": (".webp",), "image/gif": (".gif",)}


class ExportFailed(ValueError):
    """The export cannot be made as asked (the target is taken, no such conversation)."""


@dataclass
class ExportReport:
    path: str
    what: str
    conversations: int = 0
    entries: int = 0
    attachments: int = 0
    documents: int = 0
    missing: int = 0  # attachments whose blob is missing or damaged
    corrupt: int = 0  # entries whose data could not be read (exported without it)
    missing_list: list[dict] = field(default_factory=list)
    corrupt_list: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.entries / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        extra = "".join(f", {n:,} {what}" for n, what in (
            (self.missing, "attachments missing from the home"),
            (self.corrupt, "entries with unreadable data")) if n)
        return (f"exported {self.what} to {self.path}: {self.conversations:,} conversations, "
                f"{self.entries:,} entries, {self.attachments:,} attachments, "
                f"{self.documents:,} documents{extra}; {self.seconds:.1f} s, "
                f"{self.rate:,.0f} entries/s")

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "what": self.what, "conversations": self.conversations,
                "entries": self.entries, "attachments": self.attachments,
                "documents": self.documents, "missing_attachments": self.missing,
                "corrupt_entries": self.corrupt, "seconds": round(self.seconds, 3),
                "rate": round(self.rate, 1)}


def slug(text: str, limit: int = 60) -> str:
    """A file name for `text` that reads like it and names nothing else: its safe
    characters, then 8 hex digits of its hash (two keys differing only in case or in
    unsafe characters still get two files)."""
    readable = _UNSAFE.sub("_", text).strip("._")[:limit] or "x"
    return f"{readable}-{hashlib.sha256(text.encode('utf-8', 'replace')).hexdigest()[:8]}"


def file_name(name: str, media_type: str | None) -> str:
    """A shared file's name made safe (and given the suffix of what its blob holds: an
    image is kept as Steward re-encoded it)."""
    safe = _UNSAFE.sub("_", Path(name).name).strip("._")[:100] or "file"
    suffixes = _IMAGE_SUFFIX.get(media_type or "")
    if suffixes and not safe.lower().endswith(suffixes):
        safe += suffixes[0]
    return safe


def default_target(where: Path, today: date | None = None) -> Path:
    """`steward-export-<date>` in `where`, `-2`, `-3`… if taken (blocking)."""
    base = f"steward-export-{(today or date.today()).isoformat()}"
    n = 1
    while True:
        path = where / (base if n == 1 else f"{base}-{n}")
        if not path.exists():
            return path
        n += 1


def _taken(target: Path) -> bool:
    """Whether `target` exists as something other than an empty directory."""
    if not target.exists() and not target.is_symlink():
        return False
    return not (target.is_dir() and not target.is_symlink() and not any(target.iterdir()))


class _Out:
    """The files of one export, in its scratch directory. Blocking: called in a thread."""

    def __init__(self, root: Path, blobs: BlobStore):
        self.root = root
        self.blobs = blobs
        self._dirs: set[Path] = set()
        self._open: set[BinaryIO] = set()

    def _dir(self, path: Path) -> None:
        if path in self._dirs:
            return
        if path != self.root:
            self._dir(path.parent)
        path.mkdir(mode=0o700, exist_ok=True)
        self._dirs.add(path)

    def open(self, relative: str) -> BinaryIO:
        path = self.root / relative
        self._dir(path.parent)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        f = os.fdopen(fd, "wb")
        self._open.add(f)
        return f

    def close(self, f: BinaryIO) -> None:
        self._open.discard(f)
        f.flush()
        os.fsync(f.fileno())
        f.close()

    def abandon(self) -> None:
        """Close whatever is still open (the export failed; its files are removed)."""
        for f in self._open:
            f.close()
        self._open.clear()

    def write(self, relative: str, data: bytes) -> None:
        f = self.open(relative)
        try:
            f.write(data)
        finally:
            self.close(f)

    def copy_blob(self, sha: str, relative: str) -> str | None:
        """Copy blob `sha` to `relative`, checked as it is read; None, or why not."""
        try:
            source = self.blobs.path(sha)
        except ValueError:
            return "not a blob"
        try:
            src = open(source, "rb")  # noqa: SIM115 - closed below, with the copy
        except (FileNotFoundError, IsADirectoryError):
            return "missing"
        digest = hashlib.sha256()
        out = self.open(relative)
        try:
            with src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        finally:
            self.close(out)
        if digest.hexdigest() != sha:
            (self.root / relative).unlink()
            return "damaged (its bytes no longer match its sha256)"
        return None

    def sync_dirs(self) -> None:
        for path in sorted(self._dirs, key=lambda p: -len(p.parts)):  # deepest first
            fsync_path(path)


class _Conversation:
    """One conversation being written: its Markdown file, its names. Blocking methods."""

    def __init__(self, out: _Out, conv, zone: ZoneInfo, parent_key: str | None):
        self.conv = conv
        self.name = slug(conv.key)
        self.markdown = f"markdown/{self.name}.md"
        self.entries = 0
        self._out = out
        self._zone = zone
        self._parent_key = parent_key
        self._md: BinaryIO | None = None

    def page(self, entries: list, jsonl: BinaryIO, report: ExportReport,
             index: BinaryIO | None = None) -> None:
        """Write a page of entries: JSONL lines, Markdown, attachments; with `index`, the
        conversation's last page: close its Markdown and add it to the index."""
        conv = self.conv
        if self._md is None:
            self._md = self._out.open(self.markdown)
            self._md.write(_text(md.header(conv, parent_key=self._parent_key,
                                           zone=self._zone)))
        for e in entries:
            files, shown = self._attachments(e, report)
            jsonl.write(export_line(session=conv.key, owner=conv.owner, scope=conv.scope,
                                    entry=e, files=files))
            self._md.write(_text(md.entry(e, zone=self._zone, files=shown)))
        self.entries += len(entries)
        report.entries += len(entries)
        if index is not None:
            self._out.close(self._md)
            index.write(_text(md.index_line(conv, quote(self.markdown), self.entries)))

    def _attachments(self, e, report: ExportReport):
        refs = e.data.get(REF) if isinstance(e.data, dict) else None
        if not isinstance(refs, list):
            return None, []
        files: dict[str, str] = {}
        shown: list[tuple[str, str | None]] = []
        used: set[str] = set()
        for n, ref in enumerate(refs, 1):
            if not isinstance(ref, dict) or not isinstance(ref.get("blob"), str):
                continue
            sha, name = ref["blob"], str(ref.get("name") or "file")
            if sha in files:
                shown.append((name, "../" + quote(files[sha])))
                continue
            base = f"{e.seq:06d}-{file_name(name, ref.get('media_type'))}"
            if base in used:
                base = f"{e.seq:06d}-{n}-{file_name(name, ref.get('media_type'))}"
            used.add(base)
            relative = f"attachments/{self.name}/{base}"
            why = self._out.copy_blob(sha, relative)
            if why is None:
                files[sha] = relative
                shown.append((name, "../" + quote(relative)))
                report.attachments += 1
                continue
            shown.append((name, None))
            report.missing += 1
            if len(report.missing_list) < LISTED:
                report.missing_list.append({"session": self.conv.key, "seq": e.seq,
                                            "name": name, "blob": sha, "why": why})
        return files or None, shown


def _json(value: Any) -> bytes:
    try:
        return (json.dumps(value, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: JSON's escapes carry it
        return (json.dumps(value, indent=2) + "\n").encode("ascii")


def _text(markdown: str) -> bytes:
    return markdown.encode("utf-8", "replace")


class Exporter:
    def __init__(self, store: Store, blobs: BlobStore, scratch: Path, *,
                 zone: ZoneInfo, what: str):
        self.store = store
        self.out = _Out(scratch, blobs)
        self.zone = zone
        self.report = ExportReport(path="", what=what)
        self.documented: set[str] = set()  # the conversations' namespaces with documents

    async def conversations(self, *, session: str | None, person: str | None):
        """The conversations to export, a page at a time, oldest first."""
        if session is not None:
            try:
                yield await self.store.get_conversation(session)
            except NotFound:
                raise ExportFailed(f"no conversation {session!r} (steward sessions lists "
                                   "them)") from None
            return
        after = 0
        while True:
            page = await reads.conversations_after(self.store, after, limit=CONVERSATION_PAGE,
                                                   person=person)
            for conv in page:
                yield conv
            if len(page) < CONVERSATION_PAGE:
                return
            after = page[-1].id

    async def conversation(self, conv, jsonl: BinaryIO, index: BinaryIO) -> None:
        parent_key = None
        if conv.parent_id is not None:
            parent_key = (await self.store.get_conversation_by_id(conv.parent_id)).key
        writing = _Conversation(self.out, conv, self.zone, parent_key)
        async with aclosing(reads.transcript(self.store, conv.id, upto=conv.last_seq,
                                             limit=PAGE)) as pages:
            async for page in pages:
                for entry_id in page.corrupt:
                    self.report.corrupt += 1
                    if len(self.report.corrupt_list) < LISTED:
                        self.report.corrupt_list.append({"session": conv.key,
                                                         "entry_id": entry_id})
                last = len(page.entries) < PAGE
                await asyncio.to_thread(writing.page, page.entries, jsonl, self.report,
                                        index if last else None)
        self.report.conversations += 1
        namespace = conversation_namespace(conv.id)
        if namespace not in self.documented:
            return
        for name in await reads.document_names(self.store, namespace):
            doc = await self.store.read_document(namespace, name)
            await asyncio.to_thread(
                self.out.write, f"documents/{writing.name}/{slug(name)}.json",
                _json({"session": conv.key, "name": name, "version": doc.version,
                       "at_entry": doc.at_seq, "value": doc.value}))
            self.report.documents += 1

    async def facts(self, scopes: list[str] | None) -> None:
        """The facts of `scopes` (None: of every scope)."""
        if scopes is None:
            namespaces = await reads.namespaces_starting(self.store, FACTS)
        else:
            namespaces = [facts_namespace(s) for s in scopes]
        for namespace in sorted(namespaces):
            scope = namespace.removeprefix(FACTS)
            for name in await reads.document_names(self.store, namespace):
                doc = await self.store.read_document(namespace, name)
                extra = "" if name == "facts" else f"-{slug(name)}"
                await asyncio.to_thread(
                    self.out.write, f"facts/{slug(scope)}{extra}.json",
                    _json({"scope": scope, "name": name, "version": doc.version,
                           "value": doc.value}))
                self.report.documents += 1


async def export_home(store: Store, blobs: BlobStore, target: Path, *,
                      session: str | None = None, person: str | None = None,
                      timezone: str = "UTC", version: str = "") -> ExportReport:
    """Export into `target` (which must not exist, or be an empty directory): one
    conversation, one person's, or everything. Returns what it wrote."""
    if session is not None and person is not None:
        raise ExportFailed("export one conversation (--session) or one person's "
                           "(--person), not both")
    what = (f"conversation {session}" if session is not None
            else f"the conversations of {person}" if person is not None else "everything")
    target = await asyncio.to_thread(Path(target).absolute)
    if await asyncio.to_thread(_taken, target):
        raise ExportFailed(f"{target} exists and is not an empty directory; export to a "
                           "new one (--to PATH)")
    started = time.monotonic()
    scratch = target.parent / f".{target.name}.tmp-{os.getpid()}"
    await asyncio.to_thread(_scratch, scratch)
    exporter = Exporter(store, blobs, scratch, zone=ZoneInfo(timezone), what=what)
    out = exporter.out
    try:
        jsonl = await asyncio.to_thread(out.open, "conversations.jsonl")
        index = await asyncio.to_thread(out.open, "index.md")
        try:
            made = iso(time.time())
            await asyncio.to_thread(index.write, _text(md.index_header(made, what, version)))
            scopes: set[str] = set()
            exporter.documented = set(await reads.namespaces_starting(store, "conversation:"))
            async for conv in exporter.conversations(session=session, person=person):
                await exporter.conversation(conv, jsonl, index)
                if session is not None:
                    scopes.add(conv.scope)
        finally:
            await asyncio.to_thread(out.close, jsonl)
            await asyncio.to_thread(out.close, index)
        await exporter.facts(sorted(scopes) if session is not None
                             else [f"private:{person}"] if person is not None else None)
        report = exporter.report
        report.seconds = time.monotonic() - started
        report.path = str(target)
        await asyncio.to_thread(out.write, "export.json", _json({
            "format": "steward-export", "version": FORMAT_VERSION, "made": made,
            "steward": version, "what": {"session": session, "person": person},
            **{k: v for k, v in report.as_dict().items() if k not in ("path", "rate")},
            "missing_attachment_list": report.missing_list,
            "corrupt_entry_list": report.corrupt_list, "left_out": LEFT_OUT}))
        await asyncio.to_thread(_publish, out, scratch, target)
    except BaseException:
        out.abandon()
        await asyncio.to_thread(shutil.rmtree, scratch, True)
        raise
    report.seconds = time.monotonic() - started
    return report


def _scratch(scratch: Path) -> None:
    scratch.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)  # left by an export that died
    scratch.mkdir(mode=0o700)


def _publish(out: _Out, scratch: Path, target: Path) -> None:
    """Everything on disk, then the scratch directory renamed to `target` at once."""
    out.sync_dirs()
    if _taken(target):
        raise ExportFailed(f"{target} was made meanwhile; the export is not kept")
    os.rename(scratch, target)
    fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def export_command(config, args) -> int:
    """The CLI command: `args.session`, `args.person`, `args.to`, `args.json`."""
    from bot.app.installed import version
    from bot.app.opened import opened_store

    target = await asyncio.to_thread(
        lambda: Path(args.to).expanduser() if args.to else default_target(Path.cwd()))
    async with opened_store(config, create=False) as store:
        report = await export_home(store, BlobStore.of_home(config.home), target,
                                   session=args.session, person=args.person,
                                   timezone=config.agent.timezone, version=version())
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False), flush=True)
    else:
        print(report.summary(), flush=True)
    return 0

