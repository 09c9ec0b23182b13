"""Files people share (images, PDFs, office documents), made usable by the model.

    keep.py      one file in: classify by content, read it, store it, say what it was
    isolated.py  each reading in a process of its own, killed at its time limit
    worker.py    that process: its memory and CPU capped, one reader, a JSON reply
    sniff.py     what a file is: its first bytes, then its label
    images.py    Pillow: refuse bombs at the header, downscale, re-encode (EXIF dropped)
    pdf.py       pypdf: a PDF's text layer, bounded
    office.py    docx, xlsx, pptx, odt, ods, odp: their XML parts, streamed and capped
    xmltext.py   the streaming XML walk those share (no DTDs, no entities, depth capped)
    blobs.py     the content-addressed store in `<home>/blobs` (fsynced before any use)
    errors.py    why a file was not read

A connector reaches this through `AgentPort.keep`, which returns a `Kept`: the ref for the
entry's data and the text for the message. The transcript never holds the bytes: context
assembly (`bot/agent/context.py`) turns the refs of the newest images into image parts
that the model clients read from the blob store when they send.

The names below are imported when first used, so a reader process (`worker.py`) starts
without the agent's side of this package (`keep.py`, the configuration, asyncio).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .blobs import BlobStore
    from .errors import TooLarge, Unreadable
    from .keep import REF, Attachments, Kept, size_label
    from .sniff import wanted

__all__ = ["REF", "Attachments", "BlobStore", "Kept", "TooLarge", "Unreadable", "size_label",
           "wanted"]
_HOMES = {"REF": "keep", "Attachments": "keep", "BlobStore": "blobs", "Kept": "keep",
          "TooLarge": "errors", "Unreadable": "errors", "size_label": "keep",
          "wanted": "sniff"}


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
