"""Process-wide malloc settings for a process that runs for years (`steward run`).

Python's own objects live in pymalloc's arenas, but everything bigger than 512 bytes and
every C library (SQLite's page caches and statements, asyncpg's buffers, SQLAlchemy's
C extensions, OpenSSL) goes through glibc malloc. Two things make its RSS creep while the
live data stays flat (bench/soak.py measures both):

- glibc gives each thread that mallocs under contention an arena of its own, up to
  8 x cores of them. aiosqlite runs a thread per connection, asyncio.to_thread and DNS
  run in the default executor, so a dozen threads spread short-lived buffers over a
  dozen arenas; each keeps its own free pages and its own fragmentation.
- free() returns memory to the system only from the top of the main heap (and for
  chunks over the mmap threshold, which glibc raises dynamically as big blocks are
  freed). Free pages in the middle of a heap, and in the other arenas, stay resident.

`configure()` caps the arenas (M_ARENA_MAX) and should run before the process starts
threads; `trim_periodically()` hands free pages in the middle of every arena back to the
kernel (malloc_trim(0), madvise(MADV_DONTNEED) underneath) every so often, in a thread.
Linux with glibc only: elsewhere (macOS, musl) both are no-ops.
"""

import asyncio
import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc malloc.h
# Two arenas: the main one (sbrk) and one that every other thread shares. The threads here
# (aiosqlite's, the default executor's) spend their time in SQLite and I/O, not in malloc,
# while each arena keeps free pages and fragmentation of its own: bench/soak.py --rss-only,
# 10,000 turns on SQLite, 5 thread arenas holding 44 MB became one holding 25 MB, RSS at the
# end 139.5 MB instead of 144.3 MB.
ARENA_MAX = 2
# malloc_trim(0) took 2.6 ms p50, 21 ms at most over 21 calls in that soak, in a thread.
TRIM_SECONDS = 60.0


def load_glibc(find=ctypes.util.find_library, load=ctypes.CDLL):
    """The C library if this is Linux with glibc (mallopt and malloc_trim present), else
    None: macOS, musl (no gnu_get_libc_version) and anything unusual skip the settings."""
    if os.uname().sysname != "Linux":
        return None
    name = find("c")
    if name is None:
        return None
    try:
        libc = load(name)
    except OSError:
        return None
    if not all(hasattr(libc, symbol) for symbol in
               ("gnu_get_libc_version", "mallopt", "malloc_trim")):
        return None
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    libc.malloc_trim.restype = ctypes.c_int
    return libc


class Allocator:
    """The settings over one C library (`load_glibc()`'s; None: every call a no-op)."""

    def __init__(self, libc):
        self.libc = libc

    @property
    def supported(self) -> bool:
        return self.libc is not None

    def configure(self, arena_max: int = ARENA_MAX) -> bool:
        """Cap glibc's malloc arenas at `arena_max`, unless MALLOC_ARENA_MAX is set (the
        operator's choice wins). Call it first thing, before any thread exists: arenas
        already made stay. True if the setting was applied (mallopt returned 1)."""
        if self.libc is None or os.environ.get("MALLOC_ARENA_MAX"):
            return False
        applied = self.libc.mallopt(M_ARENA_MAX, arena_max) == 1
        if not applied:
            log.debug("mallopt(M_ARENA_MAX, %d) refused", arena_max)
        return applied

    def trim(self) -> bool:
        """Return the free memory of every arena to the kernel. Blocking: call it in a
        thread. True if some was released; False also where unsupported."""
        return self.libc is not None and self.libc.malloc_trim(0) == 1

    async def trim_periodically(self, seconds: float = TRIM_SECONDS) -> None:
        """Trim every `seconds` until cancelled. malloc_trim walks every arena; ctypes lets
        go of the GIL around it and it runs in the default executor, so the loop never
        waits on it. Returns at once where unsupported."""
        if self.libc is None:
            return
        while True:
            await asyncio.sleep(seconds)
            await asyncio.to_thread(self.trim)


ALLOCATOR = Allocator(load_glibc())
configure = ALLOCATOR.configure
trim = ALLOCATOR.trim
trim_periodically = ALLOCATOR.trim_periodically


def supported() -> bool:
    return ALLOCATOR.supported
