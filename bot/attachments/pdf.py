"""A PDF's text, with pypdf (blocking: `keep.py` runs it in a reader process). Bounded: at
most `MAX_PAGES` pages are read and reading stops once `max_chars` are collected; pypdf
itself caps what one compressed stream may inflate to. A scanned PDF has no text layer:
that is said."""

from __future__ import annotations

import io
import logging

from pypdf import PdfReader
from pypdf.errors import PdfReadError, PyPdfError

from .errors import TooLarge, Unreadable

MAX_PAGES = 200

logging.getLogger("pypdf").setLevel(logging.ERROR)  # its repairs of sloppy files are noise


def pdf_text(data: bytes, *, max_chars: int) -> str:
    try:
        reader = PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unreadable("the PDF is encrypted")
        pages = reader.pages
        count = len(pages)
        parts: list[str] = []
        used = 0
        for n in range(min(count, MAX_PAGES)):
            text = (pages[n].extract_text() or "").strip()
            if text:
                parts.append(f"[page {n + 1}]\n{text}")
                used += len(text)
            if used >= max_chars:
                break
    except Unreadable:
        raise
    except MemoryError:
        raise TooLarge("the PDF needs more memory than Steward gives one file") from None
    except (PdfReadError, PyPdfError, ValueError, KeyError, TypeError, AttributeError,
            IndexError, OSError, RecursionError, AssertionError) as exc:
        raise Unreadable(f"the PDF is damaged ({type(exc).__name__}: {str(exc)[:200]})"
                         ) from None
    if not parts:
        raise Unreadable(f"the PDF ({count} pages) has no text layer (a scan?)")
    if count > MAX_PAGES and used < max_chars:
        parts.append(f"[... {count - MAX_PAGES} more pages not read]")
    return "\n\n".join(parts)
