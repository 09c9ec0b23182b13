"""An image made ready for a vision model (blocking: `keep.py` runs it in a reader process).

The declared size is checked before anything is decoded, so a small file that claims to be
a 100 000 × 100 000 picture (a decompression bomb) is refused at its header; a JPEG is
decoded at a reduced scale when it is much larger than needed (`draft`), so a big photo
costs little memory; and what decoding would take (width × height × the bytes Pillow keeps
a pixel in) is checked against `DECODE_BYTES` before a byte is decoded, so a plain image
just under the pixel limit, 150 KB on disk, cannot cost half a gigabyte. It is decoded
once: shrunk in place, then turned, so no full-size copy is ever made. The result is
upright (EXIF orientation applied), at most `max_side` pixels on its longer side,
re-encoded (which drops EXIF metadata such as the place a photo was taken) as PNG when that
stays small, else as JPEG, and never more than `max_bytes`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import TooLarge, Unreadable

FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")  # what Pillow may try to open
LOSSLESS = {"PNG", "GIF", "BMP", "TIFF", "WEBP"}  # try PNG first for these (screenshots)
JPEG_QUALITIES = (85, 70, 55)
# What one decoded image may hold in memory: 25 million pixels of colour (a 6K screen);
# grey and palette images up to the pixel limit. Shrinking it costs a quarter more.
DECODE_BYTES = 100_000_000


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
            decoded = decoded_bytes(image)
            if decoded > DECODE_BYTES:
                raise TooLarge(f"the {width}×{height} image would take {decoded // 10**6} MB "
                               f"to decode (at most {DECODE_BYTES // 10**6} MB)")
            image.load()
            image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)  # in place
            ImageOps.exif_transpose(image, in_place=True)  # a square box: same size after
            encoded = _encode(image, lossless=source in LOSSLESS, max_bytes=max_bytes)
            shown = image.size
    except Unreadable:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge(f"the image declares too many pixels ({exc})") from None
    except UnidentifiedImageError:
        raise Unreadable("its content is not an image Steward can read") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # truncated or corrupt
        raise Unreadable(f"the image is damaged ({type(exc).__name__}: {exc})") from None
    if encoded is None:
        raise TooLarge(f"even compressed the image is larger than {max_bytes} bytes")
    out, media_type = encoded
    return Prepared(out, media_type, shown[0], shown[1], source, (width, height))


def decoded_bytes(image: Image.Image) -> int:
    """What Pillow will hold for `image` decoded: one byte a pixel for bilevel, grey and
    palette images, two for 16-bit grey, four for everything else (RGB is kept in four)."""
    mode = image.mode
    per_pixel = 1 if mode in ("1", "L", "P") else 2 if mode.startswith("I;16") else 4
    return image.width * image.height * per_pixel


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
