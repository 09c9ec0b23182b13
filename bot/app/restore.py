"""`steward restore BACKUP --home DIR`: a backup (bot/app/backup.py) into a new home that,
once started, catches up with the world without answering anything twice or losing what
came in after the snapshot.

Only into a new home (absent or empty): never over a live one, whose runner might be
answering while its files are replaced. The backup is verified first (every file against
its manifest, the database's integrity check), then copied: the database to the new home's
`steward.db`, the home's own files (the Slack inbox journal, the attachment blobs, a
config.toml that lived there) to their places, a config that lived elsewhere to the new
home's `config.toml` (one that named the old home's SQLite file is pointed at the new
one's). Encrypted backups are read with an age identity file (`--identity`)
or the passphrase in `--passphrase-env`'s variable. `RESTORED` in the new home says what
it came from and when the snapshot was taken.

What happened between the snapshot and the restore is found the way a crash is recovered
from, through the paths that already reconcile with the outside world:

- mail and Slack messages that came in after the snapshot are read again (the mailbox
  cursor and the Slack catch-up mark are the snapshot's; the catch-up window is widened to
  reach back to the snapshot, `on_start`);
- an answer is keyed by the message it answers (bot.agent.inbox.answer_key), so the
  restored home's answer to a message its predecessor had already answered has the same
  key, and the same Message-ID in email;
- for `RECONCILE_HOURS` after the first start, every delivery is treated as one that may
  have happened (bot/agent/deliver.py `reconcile_until`): the channel is asked whether it
  already shows the answer (Slack by the key in its messages' metadata, email by the
  Message-ID in Sent) before anything is sent; deliveries that were in flight at the
  snapshot are reconciled the same way.

The restored home still asks the model again for messages its predecessor answered after
the snapshot (their answers are found, not repeated, and its transcript keeps its own).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bot.app.errors import RestoreError
from bot.home import make_private, write_private

RESTORED = "restored.json"
RECONCILE_HOURS = 1.0  # after the first start: every delivery asks the channel first
MARGIN_HOURS = 1.0  # the Slack catch-up reaches this much before the snapshot


@dataclass(frozen=True)
class Restored:
    taken_at: float  # when the snapshot's database copy began (UTC epoch)
    reconcile_until: float  # deliveries ask their channel first until then


def restore(backup: Path, home: Path, *, identity: Path | None = None,
            passphrase: str | None = None, store_url: str | None = None) -> dict:
    """Restore `backup` into the new home `home` (blocking); the manifest. A PostgreSQL
    backup goes into the empty database `store_url` (bot/app/restore_pg.py)."""
    from bot.app.backup import Damaged, verify_backup

    backup, home = backup.resolve(), home.resolve()
    if home.exists() and any(home.iterdir()):
        raise RestoreError(f"{home} is not empty: a backup is restored into a new home only "
                           "(never over one that may be running)")
    try:
        manifest = verify_backup(backup)
    except Damaged as exc:
        raise RestoreError(str(exc)) from None
    database = manifest["database"]
    postgres = database.get("kind") != "sqlite"
    if postgres and not store_url:
        raise RestoreError("this backup holds a PostgreSQL dump: give --store-url with an "
                           "empty database to restore it into (createdb steward_restored)")
    if store_url and not postgres:
        raise RestoreError("this backup holds an SQLite database: it is restored into the "
                           "new home's steward.db (leave out --store-url)")
    opener = _Opener(backup, manifest, identity, passphrase)
    home.mkdir(parents=True, exist_ok=True)
    make_private(home)
    staging = home / ".restoring"
    staging.mkdir(mode=0o700)
    try:
        for entry in manifest["files"]:
            rel = entry["path"]
            plain = rel.removesuffix(".age") if manifest.get("encryption") else rel
            if plain == database["file"]:
                target = staging / "steward.db"
            elif plain.startswith("home/"):
                target = staging / plain.removeprefix("home/")
            elif plain.startswith("config/"):
                target = staging / "config.toml"
            else:
                continue  # the passphrase's key: read, never restored
            target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            opener.copy(entry, target)
            os.chmod(target, 0o600)
        if postgres:
            from bot.app.restore_pg import restore_dump

            dump = staging / "steward.db"
            restored_url = restore_dump(dump, store_url, database.get("schema"))
            dump.unlink()
            _point_store_at(staging / "config.toml", restored_url)
        else:
            _own_database(staging / "config.toml")
        for item in staging.iterdir():
            item.rename(home / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    taken = _epoch(manifest["taken_at"])
    write_private(home / RESTORED, json.dumps({
        "backup": manifest["name"], "from": str(backup), "taken_at": taken,
        "restored_at": time.time()}, indent=1))
    return manifest


def _own_database(config: Path) -> None:
    """A restored config that names an SQLite file (the old home's) is made to use the new
    home's own `steward.db`, where the backup's database was put: never the old one."""
    url = _store_url_of(config)
    if url is not None and url.startswith("sqlite"):
        _set_store_url(config, '""', f"restored: this home's steward.db (was {url})")


def _point_store_at(config: Path, url: str) -> None:
    """A restored home on PostgreSQL uses the database the dump went into (never the old
    one, which may still be running)."""
    if not config.exists():
        config.write_text("")
    _set_store_url(config, json.dumps(url), "restored: the database the backup went into")


def _store_url_of(config: Path) -> str | None:
    import tomllib

    try:
        return (tomllib.loads(config.read_text()).get("store") or {}).get("url") or ""
    except (OSError, ValueError):
        return None


def _set_store_url(config: Path, value: str, why: str) -> None:
    """`[store] url = value  # why` in `config`, the section made if missing."""
    import re

    text = config.read_text()
    line = f"url = {value}  # {why}"
    section = re.search(r"(?ms)^\[store\][^\n]*\n(.*?)(?=^\[|\Z)", text)
    if section is None:
        text = f"[store]\n{line}\n\n" + text
    elif re.search(r"(?m)^\s*url\s*=", section[1]):
        body = re.sub(r"(?m)^\s*url\s*=.*$", lambda _: line, section[1], count=1)
        text = text[:section.start(1)] + body + text[section.end(1):]
    else:
        text = text[:section.start(1)] + line + "\n" + text[section.start(1):]
    config.write_text(text)


def on_start(home: Path, now: float | None = None) -> Restored | None:
    """A restored home's catch-up state, noted at its first start (blocking); None for a
    home that was not restored, or whose catch-up is over."""
    path = home / RESTORED
    try:
        noted = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    now = time.time() if now is None else now
    if not isinstance(noted, dict) or not isinstance(noted.get("taken_at"), int | float):
        return None
    if not isinstance(noted.get("reconcile_until"), int | float):
        noted["reconcile_until"] = now + RECONCILE_HOURS * 3600
        write_private(path, json.dumps(noted, indent=1))
    if now >= noted["reconcile_until"]:
        return None
    return Restored(float(noted["taken_at"]), float(noted["reconcile_until"]))


def widen_catchup(config, restored: Restored, now: float | None = None) -> None:
    """The Slack catch-up reaches back to the snapshot (and `MARGIN_HOURS` before it)."""
    slack = getattr(config, "slack", None)
    if slack is None or not getattr(slack, "enabled", False) or not slack.catchup_hours:
        return  # catch-up off: the owner chose to answer only what arrives from now on
    now = time.time() if now is None else now
    needed = (now - restored.taken_at) / 3600 + MARGIN_HOURS
    slack.catchup_hours = max(slack.catchup_hours, needed)


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class _Opener:
    """A backup's files as they were before encryption."""

    def __init__(self, backup: Path, manifest: dict, identity: Path | None,
                 passphrase: str | None):
        self.backup = backup
        self.identities = []
        scheme = manifest.get("encryption")
        if not scheme:
            return
        import pyrage

        if identity is not None:
            text = identity.read_text()
            self.identities = [pyrage.x25519.Identity.from_str(line.strip())
                               for line in text.splitlines()
                               if line.strip().startswith("AGE-SECRET-KEY-")]
        elif scheme.get("passphrase_key") and passphrase:
            sealed = (backup / scheme["passphrase_key"]).read_bytes()
            key = pyrage.passphrase.decrypt(sealed, passphrase).decode().strip()
            self.identities = [pyrage.x25519.Identity.from_str(key)]
        if not self.identities:
            raise RestoreError("this backup is encrypted: give --identity FILE (an age "
                               "identity) or --passphrase-env NAME")

    def copy(self, entry: dict, target: Path) -> None:
        source = self.backup / entry["path"]
        if not self.identities:
            shutil.copyfile(source, target)
            return
        import hashlib

        import pyrage

        plain = pyrage.decrypt(source.read_bytes(), self.identities)
        if hashlib.sha256(plain).hexdigest() != entry.get("plain_sha256"):
            raise RestoreError(f"{entry['path']} does not decrypt to what was backed up")
        target.write_bytes(plain)


def restore_command(args) -> int:
    """`steward restore BACKUP --home DIR`: exit 0 restored, 1 refused (one line why)."""
    if not args.home:
        print("steward: restore needs --home DIR: the new home to restore into",
              file=sys.stderr)
        return 2
    passphrase = os.environ.get(args.passphrase_env) if args.passphrase_env else None
    try:
        manifest = restore(Path(args.backup), Path(args.home),
                           identity=Path(args.identity) if args.identity else None,
                           passphrase=passphrase,
                           store_url=getattr(args, "store_url", None))
    except (RestoreError, OSError) as exc:
        print(f"steward: {exc}", file=sys.stderr)
        return 1
    home = Path(args.home).resolve()
    config = f" --config {home / 'config.toml'}" if (home / "config.toml").exists() else ""
    print(f"restored {manifest['name']} (taken {manifest['taken_at']}) into {home}. "
          f"Start it with `steward --home {home}{config} run`: it reads again what came in "
          "since the snapshot and, for its first hour, asks Slack and the Sent folder "
          "whether an answer was already given before sending one. Do not start the old "
          "home as well: two homes would answer the same messages.")
    return 0
