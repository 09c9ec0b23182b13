"""`steward import FILE [--format jsonl|slack|mbox]`: bring existing history in.

    reader (a worker thread)           writer (the event loop)
    JsonlReader / SlackExportReader    BatchWriter: which refs are new? -> one commit
    / MboxReader: streams the file,    per batch (a submission per message on channel
    yields Item | Skip | Problem  -->  "import:<format>", so a second import adds nothing)

The input is streamed: a JSONL line, a Slack export member or an mbox message at a time,
parsed off the event loop in chunks (the next chunk is parsed while the last is being
committed). Malformed records are counted and reported with where they were, never fatal to the
import (the command still exits 1 when there were any, and says how many).
Imported entries keep their original timestamps and join live conversations by key. The
files a `steward export` wrote beside its JSONL (attachments) go into the home's blob store
before the entries that refer to them, each checked against its SHA-256.
"""

from __future__ import annotations

import asyncio
import json
import sys
import zipfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.app.opened import snapshot_dir
from bot.attachments.blobs import BlobStore, read_blob
from bot.importers.jsonl import JsonlReader
from bot.importers.model import Item, Problem, Skip
from bot.importers.progress import Progress
from bot.importers.writer import BatchWriter
from connectors.slack.export import SlackExportReader
from store import Store, open_store

__all__ = ["FORMATS", "ImportFailed", "ImportReport", "Progress", "guess_format",
           "import_command", "import_file"]

FORMATS = ("jsonl", "slack", "mbox")
CHUNK = 500  # messages per commit
LISTED_PROBLEMS = 100  # problems kept in detail; the rest are counted
SHOWN_PROBLEMS = 20  # of those, printed without --json


class ImportFailed(ValueError):
    """The file cannot be imported at all (missing, unreadable, unknown format). Malformed
    records inside a readable file are not this: they are reported and skipped."""


_EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".zip": "slack",
               ".mbox": "mbox", ".mbx": "mbox"}


def guess_format(path: Path) -> str:
    """From the extension, else from the first bytes (blocking: call it off the loop)."""
    if path.is_dir():
        return "slack"  # an unpacked Slack export
    by_name = _EXTENSIONS.get(path.suffix.lower())
    if by_name:
        return by_name
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise ImportFailed(f"{path}: {exc.strerror or exc}") from None
    if head.startswith(b"PK\x03\x04"):
        return "slack"
    if head.startswith(b"From "):
        return "mbox"
    if head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{"):
        return "jsonl"
    raise ImportFailed(f"{path}: cannot tell its format; pass --format jsonl, slack or mbox")


@dataclass
class ImportReport:
    file: str
    format: str
    read: int = 0  # messages found (new, already there, or refused by the store)
    added: int = 0
    duplicates: int = 0
    skipped: Counter = field(default_factory=Counter)  # not messages, by reason
    malformed: int = 0
    problems: list[Problem] = field(default_factory=list)  # the first LISTED_PROBLEMS
    seconds: float = 0.0
    dry_run: bool = False
    files: int = 0  # attachments' files put in the blob store (an export's)

    def problem(self, p: Problem) -> None:
        self.malformed += 1
        if len(self.problems) < LISTED_PROBLEMS:
            self.problems.append(p)

    @property
    def rate(self) -> float:
        return self.read / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        skipped = sum(self.skipped.values())
        verb = "would import" if self.dry_run else "imported"
        return (f"{verb} {self.added:,} new entries from {self.file} ({self.format}): "
                f"{self.read:,} messages, {self.duplicates:,} already there, "
                f"{skipped:,} skipped, {self.malformed:,} malformed; "
                f"{self.seconds:.1f} s, {self.rate:,.0f} messages/s")

    def as_dict(self) -> dict[str, Any]:
        return {"file": self.file, "format": self.format, "read": self.read,
                "added": self.added, "duplicates": self.duplicates,
                "skipped": dict(self.skipped), "malformed": self.malformed,
                "problems": [p.as_dict() for p in self.problems],
                "seconds": round(self.seconds, 3), "rate": round(self.rate, 1),
                "dry_run": self.dry_run, "files": self.files}


def make_reader(fmt: str, path: Path, *, owner_address: str = ""):
    """The reader for a format (blocking: it looks at the file)."""
    if fmt == "jsonl":
        return JsonlReader(path)
    if fmt == "slack":
        return SlackExportReader(path)
    if fmt == "mbox":
        from connectors.email.mbox import (
            MboxReader,  # loads the email connector's parser: only when needed
        )

        return MboxReader(path, owner_address=owner_address)
    raise ImportFailed(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")


async def _keep_files(blobs: BlobStore, items: list[Item], report: ImportReport) -> None:
    """Put the files the items name into the blob store (one file in memory at a time)."""
    for item in items:
        for sha, path in item.files:
            data = await asyncio.to_thread(read_blob, path, sha)
            if data is None:
                missing = not await asyncio.to_thread(path.is_file)
                report.problem(Problem(f"{item.key} #{item.seq}", f"attachment {path.name}: "
                                       + ("no such file" if missing
                                          else "its bytes do not match its sha256")))
                continue
            await blobs.put(data)
            report.files += 1


async def _write(writer: BatchWriter, items: list[Item], report: ImportReport) -> None:
    written = await writer.write(items)
    report.added += written.added
    report.duplicates += written.duplicates
    for p in written.problems:
        report.problem(p)


async def _whole(step) -> None:
    """Run `step` to its end even if the import is interrupted meanwhile (Ctrl-C), then
    let the interruption go on: a batch being committed is committed and counted, so what
    the report says was kept is what the database holds."""
    task = asyncio.ensure_future(step)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def _take(records: Iterator, reader, n: int) -> tuple[list, int]:
    """The next up to `n` records and how far into the input they reach (blocking)."""
    chunk = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= n:
            break
    return chunk, reader.position


async def import_file(store: Store, path: Path | str, fmt: str | None = None, *,
                      owner_address: str = "", progress: Progress | None = None,
                      chunk: int = CHUNK, dry_run: bool = False,
                      blobs: BlobStore | None = None,
                      report: ImportReport | None = None) -> ImportReport:
    """Import one file into `store`; safe to repeat (what was imported is skipped). A dry
    run reads and checks the whole file and counts what would be new, writing nothing.
    `blobs`: where the attachments' files an export names go (None: they are not read).
    `report`: filled in as the batches commit, so that an interrupted import's caller
    knows what it kept (None: a new one)."""
    path = Path(path)
    if not await asyncio.to_thread(path.exists):
        raise ImportFailed(f"{path}: no such file")
    fmt = fmt or await asyncio.to_thread(guess_format, path)
    reader = await asyncio.to_thread(make_reader, fmt, path, owner_address=owner_address)
    writer = BatchWriter(store, f"import:{fmt}", dry_run=dry_run)
    if report is None:
        report = ImportReport(str(path), fmt, dry_run=dry_run)
    records = reader.read()
    loop = asyncio.get_running_loop()
    started = loop.time()
    next_chunk = asyncio.ensure_future(asyncio.to_thread(_take, records, reader, chunk))
    try:
        while True:
            try:
                batch, position = await next_chunk
            except (OSError, zipfile.BadZipFile) as exc:
                raise ImportFailed(f"{path}: {exc}") from None
            if not batch:
                break
            next_chunk = asyncio.ensure_future(asyncio.to_thread(_take, records, reader, chunk))
            items: list[Item] = []
            for record in batch:
                if isinstance(record, Item):
                    items.append(record)
                elif isinstance(record, Skip):
                    report.skipped[record.reason] += 1
                else:
                    report.problem(record)
            report.read += len(items)
            if blobs is not None and not dry_run:
                await _keep_files(blobs, items, report)
            await _whole(_write(writer, items, report))
            if progress is not None:
                progress.update(read=report.read, added=report.added, bad=report.malformed,
                                position=position, total=reader.total)
    finally:
        # Interrupted mid-way: let the reader finish its chunk (a thread cannot be
        # cancelled) before closing it, which closes the file.
        await asyncio.wait([next_chunk])
        if not next_chunk.cancelled():
            next_chunk.exception()  # retrieved: it no longer matters
        await asyncio.to_thread(records.close)
        report.seconds = loop.time() - started
    return report


def _locate(file: str, fmt: str | None) -> tuple[Path, str]:
    path = Path(file).expanduser()
    if fmt is not None and fmt not in FORMATS:
        raise ImportFailed(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if not path.exists():
        raise ImportFailed(f"{path}: no such file")
    if fmt not in (None, "slack") and path.is_dir():
        raise ImportFailed(f"{path} is a directory, not a {fmt} file (an unpacked Slack "
                           "export is imported with --format slack)")
    return path, fmt or guess_format(path)


_NOUNS = {"jsonl": "line", "slack": "message", "mbox": "message"}


def not_of_format(report: ImportReport) -> str | None:
    """Why the file is not of its format at all (nothing in it could be read), or None."""
    if report.read or report.skipped or not report.malformed:
        return None
    first = report.problems[0] if report.problems else None
    why = f" ({first.where}: {first.reason})" if first else ""
    return (f"{report.file} is not a {report.format} file: nothing in it could be read{why}; "
            "pass --format jsonl, slack or mbox")


def malformed_line(report: ImportReport) -> str | None:
    """The line that makes an import with malformed records fail (exit 1), or None."""
    if not report.malformed:
        return None
    noun = _NOUNS.get(report.format, "record") + ("s" if report.malformed > 1 else "")
    return (f"{report.malformed:,} malformed {noun} skipped; "
            f"{'would import' if report.dry_run else 'imported'} the rest "
            f"({report.added:,} new)")


def interrupted_line(report: ImportReport) -> str:
    """What an import stopped half-way kept: every batch commits whole, and a second run
    skips what the first stored (each message's submission is keyed by its ref)."""
    if report.dry_run:
        return f"import interrupted (a dry run: nothing written) after {report.read:,} messages"
    return (f"import interrupted: kept {report.added:,} new entries of {report.read:,} "
            "messages read; running the same import again is safe (it adds only what is "
            "missing)")


async def import_command(config, args) -> int:
    """The CLI command: `args.file`, `args.format` (None: guess), `args.json`, and
    optionally `args.dry_run` (check the file, write nothing). Exit code 1 when anything
    in the file was malformed (the rest is imported all the same)."""
    path, fmt = await asyncio.to_thread(_locate, args.file, args.format)
    progress = Progress(f"importing {path.name} ({fmt})")
    report = ImportReport(str(path), fmt, dry_run=bool(getattr(args, "dry_run", False)))
    try:
        store = await open_store(config.store_url, snapshot_dir=snapshot_dir(config))
        try:
            await import_file(store, path, fmt, owner_address=config.email.address,
                              progress=progress, dry_run=report.dry_run,
                              blobs=BlobStore.of_home(config.home), report=report)
        finally:
            await store.close()
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C
        progress.close()
        print(f"steward: {interrupted_line(report)}", file=sys.stderr, flush=True)
        raise
    finally:
        progress.close()  # interrupted or failed: the bar must not stay on the screen
    if args.json:
        print(json.dumps(report.as_dict(), ensure_ascii=False), flush=True)
    wrong = not_of_format(report)
    if wrong is not None:  # its "problems" would only be every record of it, again
        print(f"steward: {wrong}", file=sys.stderr, flush=True)
        return 1
    details = [f"  {p.where}: {p.reason}" for p in report.problems[:SHOWN_PROBLEMS]]
    if report.malformed > len(details):
        details.append(f"  ... and {report.malformed - len(details):,} more")
    progress.finish(report.summary(), details)
    failed = malformed_line(report)
    if failed is None:
        return 0
    print(f"steward: {failed}", file=sys.stderr, flush=True)
    return 1
