"""The reader process: one file, started by `isolated.py` as `python -P -c BOOT`. It limits
itself before it reads a byte of the file, runs one reader, replies, and exits.

    stdin    one JSON line {"reader", "options", "size", "seconds"}, then `size` bytes
    stdout   one JSON line, then the payload it announces ("size" bytes):
               {"text": true, "size": n}                  a document's text, UTF-8
               {"image": {…}, "size": n}                  the image to send
               {"refused": "TooLarge" | "Unreadable", "reason": "…"}
               {"failed": "KeyError", "trace": "…"}       a reader's own bug

Its limits: an address space of `MEMORY` bytes above what the interpreter and the
reader's libraries take (RLIMIT_AS: past it an allocation fails, and the MemoryError is
said as TooLarge), CPU seconds just past the time limit (RLIMIT_CPU: a reader whose parent
died still ends), and no core file. Only the standard library and the reader's own
modules are imported here.
"""

from __future__ import annotations

import json
import math
import sys
import time
import traceback

from .errors import TooLarge, Unreadable

MEMORY = 512 * 1024 * 1024
REQUEST_BYTES = 64 * 1024  # the request's JSON line


def main() -> None:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    request = json.loads(stdin.readline(REQUEST_BYTES))
    run = _reader(request["reader"])
    _limit(float(request["seconds"]))
    data = stdin.read(request["size"])
    reply, payload = _run(run, data, request["options"])
    stdout.write(json.dumps(reply).encode() + b"\n")
    stdout.write(payload)
    stdout.flush()


def _reader(name: str):
    if name == "image":
        from .images import prepare
        return prepare
    if name == "pdf":
        from .pdf import pdf_text
        return pdf_text
    if name == "office":
        from .office import office_text
        return office_text
    raise ValueError(f"no reader {name!r}")


def _run(run, data: bytes, options: dict) -> tuple[dict, bytes]:
    try:
        result = run(data, **options)
    except TooLarge as exc:
        return {"refused": "TooLarge", "reason": str(exc)}, b""
    except Unreadable as exc:
        return {"refused": "Unreadable", "reason": str(exc)}, b""
    except MemoryError:
        return {"refused": "TooLarge",
                "reason": "reading it needs more memory than Steward gives one file"}, b""
    except Exception as exc:  # a reader's own bug: the parent logs it
        return {"failed": type(exc).__name__, "trace": traceback.format_exc()[-4000:]}, b""
    if isinstance(result, str):
        payload = result.encode("utf-8", "surrogatepass")
        return {"text": True, "size": len(payload)}, payload
    image = {"media_type": result.media_type, "width": result.width, "height": result.height,
             "source_format": result.source_format, "source_size": list(result.source_size)}
    return {"image": image, "size": len(result.data)}, result.data


def _limit(seconds: float) -> None:
    try:
        import resource
    except ImportError:  # not a POSIX system: the time limit still holds (by a kill)
        return
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = math.ceil(time.process_time() + seconds) + 1
    _lower(resource, resource.RLIMIT_CPU, cpu, cpu + 1)
    try:
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * resource.getpagesize()
    except OSError:  # no /proc: the memory limit would be a guess
        return
    _lower(resource, resource.RLIMIT_AS, used + MEMORY, used + MEMORY)


def _lower(resource, which: int, soft: int, hard: int) -> None:
    """Lower a limit to (soft, hard), never above what this process was given."""
    _, given = resource.getrlimit(which)
    if given != resource.RLIM_INFINITY:
        soft, hard = min(soft, given), min(hard, given)
    resource.setrlimit(which, (soft, hard))
