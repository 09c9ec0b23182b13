"""What a file is, from its first bytes first and its declared type and name second: a
file's label is a claim (an `image/png` that is really a PDF, an `.docx` that is a ZIP of
anything), its content is the fact."""

from __future__ import annotations

import posixpath

IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"GIF87a", "GIF"),
               (b"GIF89a", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"))
OFFICE_EXTENSIONS = {".docx": "docx", ".xlsx": "xlsx", ".xlsm": "xlsx", ".pptx": "pptx",
                     ".odt": "odt", ".ods": "ods", ".odp": "odp"}
OFFICE_TYPES = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "application/vnd.ms-excel.sheet.macroenabled.12": "xlsx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": "pptx",
    "application/vnd.oasis.opendocument.text": "odt",
    "application/vnd.oasis.opendocument.spreadsheet": "ods",
    "application/vnd.oasis.opendocument.presentation": "odp",
}
PDF_TYPES = {"application/pdf", "application/x-pdf"}


def image_format(data: bytes) -> str | None:
    """"PNG", "JPEG", … if the bytes start like an image Steward reads."""
    for magic, name in IMAGE_MAGIC:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def claimed(media_type: str, name: str) -> str:
    """What the label says: "image", "pdf", an office kind ("docx", …) or ""."""
    media_type = media_type.split(";")[0].strip().lower()
    ext = posixpath.splitext(name.lower())[1]
    if media_type.startswith("image/"):
        return "image"
    if media_type in PDF_TYPES or ext == ".pdf":
        return "pdf"
    return OFFICE_TYPES.get(media_type) or OFFICE_EXTENSIONS.get(ext, "")


def kind_of(data: bytes, media_type: str, name: str) -> str:
    """"image", "pdf", an office kind, or "binary" (not read), by content."""
    if image_format(data):
        return "image"
    if data[:1024].lstrip().startswith(b"%PDF-"):
        return "pdf"
    label = claimed(media_type, name)
    if data.startswith(b"PK\x03\x04") and label not in ("", "image", "pdf"):
        return label  # a ZIP: the office parts decide (`office.py`)
    return "binary"


def wanted(media_type: str, name: str) -> bool:
    """Whether a file is worth fetching to read (an image, a PDF, an office document)."""
    return claimed(media_type, name) != ""
