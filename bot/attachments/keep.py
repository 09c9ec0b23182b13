"""Taking in one shared file: what it is (by content), the form the model can use (an
image downscaled, a document's text), the bytes stored once by content hash, and what the
message says about it. A file that cannot be read becomes a note with the reason; this
never raises for bad input, so the rest of the message is still answered. Every reader
runs in a process of its own (`isolated.py`), stopped for good at `read_seconds`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import isolated, sniff
from .blobs import BlobStore
from .errors import Unreadable

if TYPE_CHECKING:
    from bot.config import AttachmentsConfig

log = logging.getLogger(__name__)

REF = "attachments"  # the entry data's key: a list of the refs below


@dataclass(frozen=True)
class Kept:
    """`ref` goes into the entry's data (under `REF`): what the file was and which blob
    holds it; `text` goes into the message: its note, and a document's text."""

    ref: dict[str, Any]
    text: str


def size_label(n: float) -> str:
    """A size as people read it: "812 bytes", "3.4 MB"."""
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{int(n)} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


ALIASES = {"JPG": "JPEG", "PJPEG": "JPEG", "X-PNG": "PNG", "X-MS-BMP": "BMP", "TIF": "TIFF"}


def _labelled(media_type: str, label: str, real: str) -> bool:
    """Whether an image's label tells the truth (no label at all is not a lie)."""
    if label == "":
        return True
    declared = media_type.split(";")[0].strip().upper().removeprefix("IMAGE/")
    return label == "image" and ALIASES.get(declared, declared) == real


class Attachments:
    def __init__(self, blobs: BlobStore, settings: AttachmentsConfig):
        self.blobs = blobs
        self.settings = settings

    async def keep(self, data: bytes, *, name: str, media_type: str) -> Kept:
        kind = sniff.kind_of(data, media_type, name)
        label = sniff.claimed(media_type, name)
        if kind == "binary" and label in ("image", "pdf"):
            kind = label  # let the reader say what is wrong with it
        head = f"{name} ({media_type or 'unknown type'}, {size_label(len(data))})"
        ref: dict[str, Any] = {"name": name, "declared_type": media_type, "size": len(data),
                               "kind": kind}
        try:
            if kind == "image":
                return await self._image(data, head, label, ref)
            if kind == "binary":
                ref["blob"] = await self.blobs.put(data)
                return Kept(ref, f"[attached file: {head}] (not a text file; not read)")
            return await self._document(data, kind, head, label, ref)
        except Unreadable as exc:
            reason = str(exc)
        except TimeoutError:
            reason = f"reading it took longer than {self.settings.read_seconds:g} seconds"
        except Exception as exc:  # a reader's own bug must not lose the message
            log.exception("attachments: reading %s failed", name)
            reason = f"the reader failed ({type(exc).__name__})"
        ref.update(kind="unreadable", note=reason)
        return Kept(ref, f"[attached file: {head}] (not read: {reason})")

    async def _read(self, reader: str, data: bytes, **options):
        return await isolated.read(reader, data, seconds=self.settings.read_seconds,
                                   **options)

    async def _image(self, data: bytes, head: str, label: str, ref: dict) -> Kept:
        s = self.settings
        ready = await self._read("image", data, max_side=s.max_image_side,
                                 max_pixels=s.max_image_pixels, max_bytes=s.max_image_bytes)
        ref.update(blob=await self.blobs.put(ready.data), media_type=ready.media_type,
                   blob_size=len(ready.data), width=ready.width, height=ready.height)
        w, h = ready.source_size
        sent = "" if (w, h) == (ready.width, ready.height) else \
            f", shown at {ready.width}×{ready.height}"
        lie = "" if _labelled(ref["declared_type"], label, ready.source_format) else \
            f"; it is a {ready.source_format} image"
        return Kept(ref, f"[image: {head}, {w}×{h}{sent}{lie}]")

    async def _document(self, data: bytes, kind: str, head: str, label: str,
                        ref: dict) -> Kept:
        cap = self.settings.max_text_chars
        if kind == "pdf":
            text = await self._read("pdf", data, max_chars=cap + 1)
        else:
            text = await self._read("office", data, kind=kind, max_chars=cap + 1)
        ref["blob"] = await self.blobs.put(data)
        if len(text) > cap:
            text = text[:cap] + "\n[... the rest is not shown here]"
        lie = f"; it is a {kind.upper()}" if label and label != kind else ""
        name = ref["name"]
        return Kept(ref, f"[document: {head}{lie}]\n{text}\n[end of {name}]")
