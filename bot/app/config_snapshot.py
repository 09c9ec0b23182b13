"""The config as last validated, for the commands that only read (`sessions`, `log`,
`search`): they start without pydantic, whose import was half of their start-up.

Every full load writes what it validated to `<home>/config.validated.json`, with what the
result depended on: the file and its bytes, the home, the code that validated it and the
environment variables it needs. A reading command that finds all of these as they were
uses the result as it is. Anything else (an edited file, another build, a secret the
command needs no longer set, no snapshot) and it loads the config in full, which reports
what is wrong as always. Secrets are never in it: the config only names their variables,
by section, so that a command checks only those of the sections it uses.
"""

import hashlib
import json
import os
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bot.config_source import Found, secret, store_url
from bot.home import write_private

NAME = "config.validated.json"
_FORMAT = 2  # 2: the secrets' names by section
# Code whose change may change what a file validates to: Steward's own modules loaded by
# then (the sections, their validators and what those import) and the validator library.
_CODE_PACKAGES = ("bot", "connectors", "store", "pydantic", "pydantic_core")


class Snapshot:
    """Reads like the validated config for what the reading commands use: each section as
    an object of its keys, `home`, `path`, `store_url` and `secret()`."""

    def __init__(self, sections: Mapping[str, Any], *, home: Path, path: Path | None,
                 env: Mapping[str, str]):
        for name, values in sections.items():
            setattr(self, name, SimpleNamespace(**values) if isinstance(values, dict)
                    else values)
        self.home, self.path, self._env = home, path, dict(env)

    @property
    def store_url(self) -> str:
        return store_url(self.store.url, self.home)

    def secret(self, env_name: str) -> str:
        return secret(self._env, env_name, self.path)


def _digest(raw: bytes | None) -> str | None:
    return hashlib.sha256(raw).hexdigest() if raw is not None else None


def _stamp(file: str) -> list | None:
    try:
        st = os.stat(file)
    except OSError:
        return None
    return [file, st.st_mtime_ns, st.st_size]


def _code() -> list[list]:
    files = sorted({m.__file__ for name, m in list(sys.modules.items())
                    if name.split(".")[0] in _CODE_PACKAGES
                    and getattr(m, "__file__", None)})
    return [s for f in files if (s := _stamp(f)) is not None]


def _inputs(found: Found) -> dict:
    return {"format": _FORMAT, "path": str(found.path) if found.path else None,
            "digest": _digest(found.raw), "home": str(found.home)}


def remember(config, found: Found) -> None:
    """After a full load: write the snapshot into the home, if the home exists (creating
    it is the command's business) and the snapshot changed. Never fails the command."""
    from bot.config import secret_sections

    if config.embeddings.provider == "local":
        return  # its validation looks at the installed packages, which no stamp covers
    snapshot = {**_inputs(found), "code": _code(),
                "secrets": sorted(map(list, set(secret_sections(config)))),
                "config": config.model_dump(mode="json")}
    text = json.dumps(snapshot, sort_keys=True)
    target = found.home / NAME
    try:
        if not found.home.is_dir() or (target.is_file() and target.read_text() == text):
            return
        write_private(target, text)
    except OSError:
        pass  # a read-only or full home: the next reading command validates in full


def recall(found: Found, env: Mapping[str, str], needs: Collection[str] | None = None
           ) -> Snapshot | None:
    """The config as last validated, if nothing it depended on has changed and the secrets
    of the sections in `needs` (None: all) are set; else None."""
    try:
        snapshot = json.loads((found.home / NAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(snapshot, dict) or any(snapshot.get(k) != v
                                             for k, v in _inputs(found).items()):
        return None
    code = snapshot.get("code")
    if not isinstance(code, list) or any(not isinstance(c, list) or not c
                                         or _stamp(c[0]) != c for c in code):
        return None
    if not _secrets_set(snapshot.get("secrets"), env, needs):
        return None
    sections = snapshot.get("config")
    if not isinstance(sections, dict):
        return None
    return Snapshot(sections, home=found.home, path=found.path, env=env)


def _secrets_set(secrets, env: Mapping[str, str], needs: Collection[str] | None) -> bool:
    """Whether every secret of the sections in `needs` among the remembered `secrets`
    (`[section, variable]` pairs) is set in `env`."""
    if not isinstance(secrets, list):
        return False
    for item in secrets:
        if not (isinstance(item, list) and len(item) == 2
                and all(isinstance(part, str) for part in item)):
            return False
        section, name = item
        if (needs is None or section in needs) and not env.get(name):
            return False
    return True
