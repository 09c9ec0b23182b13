"""One reader for one file, in a process of its own (`worker.py`), killed at its time limit.

The readers are blocking work on untrusted bytes (Pillow, pypdf, expat on a ZIP's parts).
In a thread, a reader past its time could only be abandoned: it went on using CPU and
holding memory until it finished. Here each file gets a fresh Python that caps its own
address space and CPU time before it reads a byte; when the time is up it is killed and
waited for, so its memory is back before `read` returns, and a crash in a C library is
one file's note rather than Steward's end. Nothing here blocks the event loop: the
process, its pipes and its exit are asyncio's.

What crosses is plain bytes and JSON, never pickle: a reader subverted by its input must
not be able to run code in this process, so its reply is checked like any input.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from .errors import TooLarge, Unreadable
from .images import Prepared

log = logging.getLogger(__name__)

ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the `bot` package
BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
        "from bot.attachments.worker import main; main()")
CHUNK = 256 * 1024
REPLY_BYTES = 64 * 1024 * 1024  # the most a reader may say (an image to send, a text)


async def read(reader: str, data: bytes, *, seconds: float, **options) -> Prepared | str:
    """What `reader` ("image", "pdf", "office") makes of `data`, called with `options`.
    Raises Unreadable (TooLarge) as the reader did, and TimeoutError past `seconds`."""
    request = json.dumps({"reader": reader, "options": options, "size": len(data),
                          "seconds": seconds}).encode() + b"\n"
    process = None
    try:
        async with asyncio.timeout(seconds):
            # -P: the working directory is not on the path (no stray PIL.py from there)
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-P", "-c", BOOT, ROOT, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
            reply = await _exchange(process, request, data)
            code = await process.wait()
    finally:
        if process is not None:
            if process.returncode is None:
                process.kill()  # past its time, or the caller gave up: it stops now
            # Read what it left to the end: until its pipes are closed `wait` waits on
            # (a reply half-written when it was killed would hold them open for good).
            while await process.stdout.read(CHUNK):
                pass
            await process.wait()
    return _answer(reader, reply, code)


async def _exchange(process: asyncio.subprocess.Process, request: bytes, data: bytes) -> bytes:
    async def send() -> None:
        try:
            process.stdin.write(request)
            process.stdin.write(data)
            await process.stdin.drain()
            process.stdin.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # it stopped reading early: its reply (or its exit) says why

    async def receive() -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := await process.stdout.read(CHUNK):
            size += len(chunk)
            if size > REPLY_BYTES:
                raise Unreadable("the reader's reply is too long")
            chunks.append(chunk)
        return b"".join(chunks)

    sending = asyncio.ensure_future(send())
    try:
        received = await receive()
    except BaseException:
        sending.cancel()
        raise
    await sending  # done: the reader replies only after it has read everything
    return received


def _answer(reader: str, reply: bytes, code: int) -> Prepared | str:
    head, _, payload = reply.partition(b"\n")
    try:
        answer = json.loads(head)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        log.warning("attachments: the %s reader ended without a reply (%s)", reader,
                    _exit(code))
        if code == -signal.SIGXCPU:
            raise TimeoutError
        raise Unreadable(f"the reader stopped ({_exit(code)})")
    try:
        if "refused" in answer:
            error = TooLarge if answer["refused"] == "TooLarge" else Unreadable
            raise error(str(answer["reason"])[:500])
        if "failed" in answer:
            log.error("attachments: the %s reader failed:\n%s", reader,
                      str(answer.get("trace"))[-4000:])
            raise Unreadable(f"the reader failed ({str(answer['failed'])[:80]})")
        if len(payload) != answer["size"]:
            raise ValueError("the payload is not the size announced")
        if answer.get("text") is True:
            return payload.decode("utf-8", "surrogatepass")
        image = answer["image"]
        width, height = image["source_size"]
        return Prepared(payload, _str(image["media_type"]), _int(image["width"]),
                        _int(image["height"]), _str(image["source_format"]),
                        (_int(width), _int(height)))
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
        log.warning("attachments: the %s reader's reply is malformed (%s)", reader, exc)
        raise Unreadable("the reader's reply is malformed") from None


def _str(value) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value[:100]


def _int(value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 1 << 31:
        raise TypeError("not a size")
    return value


def _exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
