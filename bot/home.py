"""The home directory is private to its owner: the directory 0700, the files in it 0600.

New files are created private where they are made (the database in `store.engine`, the
runner lock, the Slack journal) and the CLI sets umask 0o077 for anything else; this
tightens what an older version, a restore or a hand-made directory left readable. Only
group and other bits are cleared (an owner's bits are left as they are), only the
directory itself and the regular files directly in it are touched, and never through a
symlink. A shared directory (world-writable and sticky, like /tmp) is left alone: a home
there is a mistake the directory's mode cannot fix.

A home that cannot be one (a file, a directory that cannot be created) is a `HomeError`:
one line for the person, naming the path and where it came from.
"""

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE = 0o077  # the bits that must be clear: group and other


class HomeError(ValueError):
    """The home directory cannot be used: it is not a directory, or cannot be made."""


def check_home(home: Path, origin: str = "") -> None:
    """Refuse a home that exists and is not a directory (blocking: a stat). `origin` says
    where the path came from (``--home``, ``$STEWARD_HOME``), for the message."""
    where = f" (from {origin})" if origin else ""
    try:
        if home.exists() and not home.is_dir():
            raise HomeError(f"home {home}{where} is not a directory; point it at a "
                            "directory (it is created if missing)")
        for parent in home.parents:  # the first one that exists must be a directory
            if parent.exists():
                if not parent.is_dir():
                    raise HomeError(f"home {home}{where}: {parent} is not a directory")
                break
    except OSError as exc:
        raise HomeError(f"home {home}{where}: {exc.strerror or exc}") from None


def make_private(home: Path) -> None:
    """Create `home` 0700 if missing, else tighten it and the files in it (blocking: call
    it in a thread from async code)."""
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise HomeError(f"home {home} is not a directory") from None
    except OSError as exc:
        raise HomeError(f"cannot create the home directory {home}: "
                        f"{exc.strerror or exc}") from None
    info = home.stat()
    shared = info.st_mode & stat.S_ISVTX and info.st_mode & stat.S_IWOTH
    if shared or info.st_uid != os.geteuid():
        log.warning("home %s is not a private directory of this user; not changing it", home)
        return
    _tighten(home, info.st_mode)
    for entry in os.scandir(home):
        try:
            if entry.is_file(follow_symlinks=False):
                _tighten(Path(entry.path), entry.stat(follow_symlinks=False).st_mode)
        except OSError as exc:  # vanished meanwhile, or not ours
            log.warning("cannot make %s private: %s", entry.path, exc)


def _tighten(path: Path, mode: int) -> None:
    if mode & PRIVATE:
        os.chmod(path, stat.S_IMODE(mode) & ~PRIVATE)


def write_private(path: Path, text: str, *, sync: bool = False) -> None:
    """Replace `path` with `text` at once (a scratch file renamed over it), 0600; `sync`:
    on disk before the rename. A failure leaves `path` as it was and no scratch behind."""
    scratch = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            if sync:
                out.flush()
                os.fsync(out.fileno())
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise

