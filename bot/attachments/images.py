"""An image made ready for a vision model (blocking: call it in a thread).

The declared size is checked before anything is decoded, so a small file that claims to be
a 100 000 × 100 000 picture (a decompression bomb) is refused at its header; a JPEG is
decoded at a reduced scale when it is much larger than needed (`draft`), so a big photo
costs little memory. The result is upright (EXIF orientation applied), at most
`max_side` pixels on its longer side, re-encoded (which drops EXIF metadata such as the
place a photo was taken) as PNG when that stays small, else as JPEG, and never more than
`max_bytes`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import TooLarge, Unreadable

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")  # what Pillow may try to open
LOSSLESS = {"PNG", "GIF", "BMP", "TIFF", "WEBP"}  # try PNG first for these (screenshots)
JPEG_QUALITIES = (85, 70, 55)


@dataclass(frozen=True)
class Prepared:
    data: bytes
    media_type: str  # "image/png" or "image/jpeg"
    width: int
    height: int
    source_format: str  # what the file really was ("PNG", "JPEG", …)
    source_size: tuple[int, int]


def prepare(data: bytes, *, max_side: int, max_pixels: int, max_bytes: int) -> Prepared:
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise TooLarge(f"the image declares {width}×{height} pixels, more than the "
                               f"{max_pixels}-pixel limit")
            source = image.format or "image"
            if source == "JPEG":
                image.draft("RGB", (max_side, max_side))  # decode at 1/2, 1/4 or 1/8 scale
            image.load()
            frame = ImageOps.exif_transpose(image)
    except Unreadable:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge(f"the image declares too many pixels ({exc})") from None
    except UnidentifiedImageError:
        raise Unreadable("its content is not an image Steward can read") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # truncated or corrupt
        raise Unreadable(f"the image is damaged ({type(exc).__name__}: {exc})") from None
    frame.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    encoded = _encode(frame, lossless=source in LOSSLESS, max_bytes=max_bytes)
    if encoded is None:
        raise TooLarge(f"even compressed the image is larger than {max_bytes} bytes")
    out, media_type = encoded
    return Prepared(out, media_type, frame.width, frame.height, source, (width, height))


def _encode(image: Image.Image, *, lossless: bool, max_bytes: int) -> tuple[bytes, str] | None:
    alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    if lossless:
        png = _save(image.convert("RGBA" if alpha else "RGB"), "PNG")
        if len(png) <= max_bytes:
            return png, "image/png"
    flat = _flatten(image) if alpha else image.convert("RGB")
    for quality in JPEG_QUALITIES:
        jpeg = _save(flat, "JPEG", quality=quality)
        if len(jpeg) <= max_bytes:
            return jpeg, "image/jpeg"
    return None


def _flatten(image: Image.Image) -> Image.Image:
    """Transparent parts on white (JPEG has no alpha)."""
    rgba = image.convert("RGBA")
    background = Image.new("RGB", rgba.size, "white")
    background.paste(rgba, mask=rgba.getchannel("A"))
    return background


def _save(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()
