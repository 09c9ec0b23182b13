"""Small files that cost a lot to read (issue 32): each bomb is built here, read in a child
Python (`python -c`) through the public API, and that process's peak memory is measured
(its own and that of the readers it ran), so a bomb refused too late shows up as
megabytes, not as a passing note.

    a .docx of deeply nested tags, 19 KB        refused at the XML depth limit
    a PNG just under the pixel cap, ~115 KB     refused from its header (decoded size)
    the largest image that is decoded           under the same bound
    a Slack export's users.json, < 1 MB zip     refused by its decompressed size
    ... or by its count of values               (30 MB of `[],` is a gigabyte of lists)
    a reader past its time, or given up on      its process is killed and gone
    a reader process that grows                 stopped at its address-space limit
"""

import asyncio
import io
import json
import os
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from bot.attachments import Attachments, BlobStore, TooLarge, xmltext
from bot.attachments.images import DECODE_BYTES
from bot.config import AttachmentsConfig
from connectors.slack.export import SlackExportReader

ROOT = Path(__file__).resolve().parent.parent
PEAK_MB = 200  # what reading any one of these bombs may cost, at its peak
W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

# The measured run: the work in a process of its own, its peak and its readers' peak.
# Its own peak is VmHWM (ru_maxrss would count the pytest process it was forked from);
# a reader's ru_maxrss counts this process's resident memory when it was started too (a
# little too much, never too little). An address-space guard keeps a regression from
# taking the machine with it.
HARNESS = r"""
import asyncio, json, resource, sys
from pathlib import Path


def hwm():
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


resource.setrlimit(resource.RLIMIT_AS, (4 << 30, resource.RLIM_INFINITY))
what, path = sys.argv[1], Path(sys.argv[2])
settings = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
if what == "keep":
    from bot.attachments import Attachments, BlobStore
    from bot.config import AttachmentsConfig

    keeper = Attachments(BlobStore(path.parent / "blobs"), AttachmentsConfig(**settings))
    base = hwm()
    kept = asyncio.run(keeper.keep(path.read_bytes(), name=path.name, media_type=""))
    out = {"kind": kept.ref["kind"], "text": kept.text}
else:
    from connectors.slack.export import SlackExportReader

    base = hwm()
    found = list(SlackExportReader(path).read())
    out = {"problems": [f"{p.where}: {p.reason}" for p in found if hasattr(p, "reason")]}
out["base_mb"] = base
out["self_mb"] = hwm()
out["readers_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
print(json.dumps(out))
"""


def measured(what: str, path: Path, **settings) -> dict:
    done = subprocess.run([sys.executable, "-c", HARNESS, what, str(path), json.dumps(settings)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def assert_bounded(result: dict) -> None:
    peak = max(result["self_mb"], result["readers_mb"])
    assert peak < PEAK_MB, result


# -- builders ---------------------------------------------------------------------------


def nested_docx(depth: int = 6_500_000) -> bytes:
    """word/document.xml opens `depth` elements and never closes them (~19 KB zipped)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("[Content_Types].xml", '<?xml version="1.0"?><Types/>')
        with z.open("word/document.xml", "w") as part:
            part.write(f"<w:document {W}><w:body>".encode())
            part.write(b"<a>" * depth)
    return out.getvalue()


def flat_docx(elements: int) -> bytes:
    """A well-formed document of `elements` empty elements and no text: slow, not deep."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        with z.open("word/document.xml", "w") as part:
            part.write(f"<w:document {W}><w:body>".encode())
            part.write(b"<a/>" * elements)
            part.write(b"</w:body></w:document>")
    return out.getvalue()


def plain_png(width: int, height: int) -> bytes:
    """A real RGB PNG of one colour, streamed row by row (small on disk, big decoded)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))
    packer = zlib.compressobj(9)
    row = b"\x00" + b"\x00" * (3 * width)
    body = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body)
            + chunk(b"IEND", b""))


def slack_zip(path: Path, *users: bytes) -> Path:
    """An export whose users.json is the `users` pieces, streamed into the zip."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        with z.open("users.json", "w") as part:
            for piece in users:
                part.write(piece)
        z.writestr("channels.json", '[{"id": "C0GENERAL", "name": "general"}]')
        z.writestr("general/2024-01-01.json",
                   '[{"type": "message", "user": "U1", "text": "hi", "ts": "1704103320.1"}]')
    return path


# -- office documents -------------------------------------------------------------------


def test_deeply_nested_xml_is_refused_at_its_depth(tmp_path):
    bomb = tmp_path / "nested.docx"
    bomb.write_bytes(nested_docx())
    assert bomb.stat().st_size < 25_000
    result = measured("keep", bomb)
    assert result["kind"] == "unreadable", result
    assert "nested deeper than" in result["text"], result
    assert_bounded(result)


def test_too_many_elements_are_refused():
    flat = io.BytesIO(b"<body>" + b"<a/>" * 1001 + b"</body>")
    with pytest.raises(TooLarge, match="more than 1000 elements"):
        xmltext.walk(flat, limit=10**6, start=ignore, end=ignore, text=ignore, elements=1000)
    deep = io.BytesIO(b"<a>" * 101 + b"</a>" * 101)
    with pytest.raises(TooLarge, match="nested deeper than 100 elements"):
        xmltext.walk(deep, limit=10**6, start=ignore, end=ignore, text=ignore, depth=100)


def ignore(*_args) -> None:
    pass


# -- images -----------------------------------------------------------------------------


def test_a_png_just_under_the_pixel_cap_is_bounded(tmp_path):
    cap = AttachmentsConfig().max_image_pixels
    side = int(cap ** 0.5)
    assert side * side <= cap < (side + 1) * (side + 1)
    bomb = tmp_path / "plain.png"
    bomb.write_bytes(plain_png(side, side))
    assert bomb.stat().st_size < 200_000
    result = measured("keep", bomb)
    assert_bounded(result)
    assert result["kind"] == "unreadable" and "to decode" in result["text"], result


def test_the_largest_image_that_is_decoded_stays_bounded(tmp_path):
    side = int((DECODE_BYTES // 4) ** 0.5)  # RGB is decoded at four bytes a pixel
    image = tmp_path / "large.png"
    image.write_bytes(plain_png(side, side))
    result = measured("keep", image)
    assert result["kind"] == "image", result
    assert f"{side}×{side}, shown at 1568×1568" in result["text"]
    assert_bounded(result)


# -- the time limit ---------------------------------------------------------------------


def descendants(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


class Readers:
    """The processes this test process starts while it is watched (polled from /proc)."""

    def __init__(self):
        self.before = descendants(os.getpid())
        self.seen: set[int] = set()
        self.one_ran = asyncio.Event()
        self.task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            self.seen |= await asyncio.to_thread(descendants, os.getpid()) - self.before
            if self.seen:
                self.one_ran.set()
            await asyncio.sleep(0.02)

    async def until_one_runs(self) -> None:
        async with asyncio.timeout(20):
            await self.one_ran.wait()

    def stop(self) -> set[int]:
        self.task.cancel()
        return self.seen


async def test_a_reader_past_its_time_is_killed(tmp_path):
    keeper = Attachments(BlobStore(tmp_path / "blobs"), AttachmentsConfig(read_seconds=0.5))
    slow = flat_docx(1_900_000)  # a few seconds of work within every limit
    readers = Readers()
    started = time.monotonic()
    try:
        kept = await keeper.keep(slow, name="slow.docx", media_type=DOCX)
    finally:
        seen = readers.stop()
    took = time.monotonic() - started
    assert kept.ref["kind"] == "unreadable" and "took longer than 0.5 seconds" in kept.text
    assert took < 5, took
    assert seen, "the reader did not run in a process of its own"
    assert not [pid for pid in seen if alive(pid)], "a reader outlived its time limit"


async def test_a_reader_whose_caller_gives_up_is_killed(tmp_path):
    keeper = Attachments(BlobStore(tmp_path / "blobs"), AttachmentsConfig(read_seconds=60))
    readers = Readers()
    reading = asyncio.create_task(keeper.keep(flat_docx(1_900_000), name="slow.docx",
                                              media_type=DOCX))
    try:
        await readers.until_one_runs()
        reading.cancel()  # the runner drains at shutdown: it cancels the step
        with pytest.raises(asyncio.CancelledError):
            await reading
    finally:
        seen = readers.stop()
    assert seen and not [pid for pid in seen if alive(pid)]


def test_a_reader_process_cannot_grow_past_its_memory():
    grow = ("from bot.attachments import worker\n"
            "worker._limit(10)\n"
            "try:\n"
            "    hoard = bytearray(worker.MEMORY + (64 << 20))\n"
            "except MemoryError:\n"
            "    print('refused')\n"
            "small = bytearray(worker.MEMORY // 2)\n"
            "print('fits')\n")
    done = subprocess.run([sys.executable, "-c", grow], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.split() == ["refused", "fits"], done.stderr[-2000:]


# -- Slack exports ----------------------------------------------------------------------


def test_a_users_json_zip_bomb_is_refused(tmp_path):
    export = slack_zip(tmp_path / "export.zip", b"[", *[b" " * 1_000_000] * 400, b"]")
    assert export.stat().st_size < 1_000_000
    result = measured("slack", export)
    assert_bounded(result)
    [problem] = [p for p in result["problems"] if p.startswith("users.json")]
    assert "larger than" in problem, result


def test_a_users_json_of_many_tiny_values_is_refused(tmp_path):
    # 30 MB of text that would parse to ten million lists (about a gigabyte)
    export = slack_zip(tmp_path / "export.zip", b"[", *[b"[]," * 1_000_000] * 10, b"[]]")
    assert export.stat().st_size < 1_000_000
    result = measured("slack", export)
    assert_bounded(result)
    [problem] = [p for p in result["problems"] if p.startswith("users.json")]
    assert "values" in problem, result


def test_deeply_nested_json_in_an_export_is_a_problem(tmp_path):
    export = slack_zip(tmp_path / "export.zip", b"[" * 100_000 + b"]" * 100_000)
    found = list(SlackExportReader(export).read())
    [problem] = [p for p in found if getattr(p, "where", "") == "users.json"]
    assert "nested" in problem.reason
