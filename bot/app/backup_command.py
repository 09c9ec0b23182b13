"""`steward backup [--to DIR] [--verify BACKUP] [--json]` (bot/app/backup.py does it)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from bot.app.backup import take_backup, verify_backup
from bot.attachments import size_label


def _summary(path: Path, manifest: dict) -> dict:
    files = manifest["files"]
    database = manifest.get("database") or {}
    return {"path": str(path), "taken_at": manifest["taken_at"],
            "database": database.get("kind"), "revision": database.get("revision"),
            "max_entry_id": database.get("max_entry_id"), "entries": database.get("entries"),
            "files": len(files),
            "blobs": sum(f["path"].startswith("home/blobs/") for f in files),
            "bytes": sum(f["size"] for f in files),
            "encrypted": manifest.get("encryption") is not None,
            "skipped": manifest.get("skipped") or []}


def _verify(text: str, pg_dump: str) -> tuple[Path, dict]:
    path = Path(text).expanduser().absolute()
    return path, verify_backup(path, pg_dump=pg_dump)


async def backup_command(config, args) -> int:
    if args.verify:
        path, manifest = await asyncio.to_thread(_verify, args.verify, config.backup.pg_dump)
        found = _summary(path, manifest)
        if args.json:
            print(json.dumps({**found, "verified": True}))
        else:
            print(f"backup {path} is good: {found['files']} files, "
                  f"{size_label(found['bytes'])}, taken {found['taken_at']}"
                  + (" (encrypted: the database was checked when it was taken)"
                     if found["encrypted"] else ""))
        return 0
    made = await take_backup(config, Path(args.to) if args.to else None)
    found = {**_summary(made.path, made.manifest), "seconds": made.seconds,
             "linked": made.linked, "removed": [str(p) for p in made.removed]}
    if args.json:
        print(json.dumps(found))
        return 0
    what = f"{found['entries']} entries" if found["entries"] is not None else "no entries"
    print(f"backup {made.path}: {what}, {found['files']} files ({found['blobs']} blobs), "
          f"{size_label(found['bytes'])}, verified, in {made.seconds:.1f} s")
    for skipped in found["skipped"]:
        print(f"  left out {skipped['path']}: {skipped['reason']}")
    if made.removed:
        print(f"  removed {len(made.removed)} older backup(s) ([backup] keep = "
              f"{config.backup.keep})")
    return 0
