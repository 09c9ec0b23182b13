"""`steward export` of a long history (issue 35): speed and memory, and the round trip.

A store (SQLite, or PostgreSQL with --postgres) gets --entries entries (~190 characters
each, user and assistant in turn) in --conversations conversations; then everything is
exported (`bot.app.export.export_home`: JSONL, Markdown, index, manifest), measured for
time and RSS, and once more under tracemalloc for its peak; then the JSONL is imported
into a second, empty store and exported again, and the two JSONL files compared.

Prints entries/s for the export and the import, the tracemalloc peak, RSS before and
after, and whether the second export is byte-identical. FAIL (exit status 1) if it is not,
or the tracemalloc peak is over 20 MB.

usage: .venv/bin/python bench/export.py [--entries 100000] [--conversations 20]
           [--postgres] [--json]
"""

import argparse
import asyncio
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

if __name__ == "__main__":  # the project root first: this directory's `store.py` shadows it
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.store import _proc_status, note, postgres_url, sqlite_url  # noqa: E402
from bot.app.export import export_home  # noqa: E402
from bot.app.importers import Progress, import_file  # noqa: E402
from bot.attachments.blobs import BlobStore  # noqa: E402
from store import Writes, open_store  # noqa: E402

TEXT = "a message of ordinary length, about what was said that day and what came of it " * 2
PEAK_LIMIT = 20_000_000


async def fill(store, entries: int, conversations: int) -> None:
    ids = [(await store.ensure_conversation(f"cli:bench-{c}", owner="bench",
                                            scope="private:bench")).id
           for c in range(conversations)]
    t0 = 1_700_000_000.0
    for start in range(0, entries, 2000):
        w = Writes()
        for i in range(start, min(entries, start + 2000)):
            w.append(ids[i % conversations], "user" if i % 2 == 0 else "assistant",
                     f"{i} {TEXT}", author="Bench" if i % 2 == 0 else None, ref=f"r{i}",
                     created_at=t0 + i * 1.25, data={"channel": "cli"})
        await store.commit(w)


async def run(args) -> dict:
    opened = postgres_url if args.postgres else sqlite_url
    with tempfile.TemporaryDirectory(prefix="steward-export-bench-") as tmp:
        tmp = Path(tmp)
        async with opened() as url, opened() as url2:
            store = await open_store(url)
            try:
                note(f"filling {args.entries:,} entries")
                await fill(store, args.entries, args.conversations)
                rss_before = _proc_status(reset_peak=True)["VmRSS"]
                report = await export_home(store, BlobStore.of_home(tmp / "home"),
                                           tmp / "first")
                rss_after = _proc_status()
                tracemalloc.start()  # again, traced (which makes it several times slower)
                await export_home(store, BlobStore.of_home(tmp / "home"), tmp / "traced")
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
            finally:
                await store.close()
            fresh = await open_store(url2)
            try:
                started = time.monotonic()
                imported = await import_file(
                    fresh, tmp / "first" / "conversations.jsonl",
                    progress=Progress("import", interactive=False),
                    blobs=BlobStore.of_home(tmp / "home2"))
                import_seconds = time.monotonic() - started
                await export_home(fresh, BlobStore.of_home(tmp / "home2"), tmp / "second")
            finally:
                await fresh.close()
            same = ((tmp / "first" / "conversations.jsonl").read_bytes()
                    == (tmp / "second" / "conversations.jsonl").read_bytes())
            size = (tmp / "first" / "conversations.jsonl").stat().st_size
    return {"backend": "postgresql" if args.postgres else "sqlite", "entries": report.entries,
            "conversations": report.conversations, "export_seconds": round(report.seconds, 2),
            "export_entries_per_s": round(report.rate), "jsonl_mb": round(size / 1e6, 1),
            "tracemalloc_peak_mb": round(peak / 1e6, 2), "rss_before_mb": round(rss_before),
            "rss_after_mb": round(rss_after["VmRSS"]), "rss_peak_mb": round(rss_after["VmHWM"]),
            "import_entries_per_s": round(imported.added / import_seconds),
            "second_export_identical": same, "peak_ok": peak < PEAK_LIMIT}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=100_000)
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--postgres", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:26} {value}")
    ok = result["second_export_identical"] and result["peak_ok"]
    if not ok:
        print("FAIL", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
