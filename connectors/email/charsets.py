"""Bytes of a text part (or header) to `str`, whatever its declared charset claims.

Real mail declares charsets that are misspelt (``utf8``, ``"UTF-8"``), unknown
(``x-unknown``, ``unknown-8bit``), wrong (UTF-8 labelled ISO-8859-1) or absent (8-bit
bytes in a message that says nothing). The order tried: the declared charset (unless it is
a single-byte Latin one and the bytes are valid UTF-8, the commonest mislabelling), then
UTF-8, then a statistical guess among the charsets mail is written in (only for text that
is mostly non-ASCII: Cyrillic, Greek, CJK...; for a few accented letters it guesses worse
than Windows-1252), then Windows-1252 with replacement characters. Never raises.
"""

import codecs

from charset_normalizer import from_bytes

# Labels seen in the wild that Python does not know, or knows as something else.
ALIASES = {
    "unknown-8bit": None, "x-unknown": None, "unknown": None, "x-user-defined": None,
    "default": None, "charset": None, "ks_c_5601-1987": "cp949", "x-mac-roman": "mac_roman",
    "iso-8859-8-i": "iso-8859-8", "gb2312": "gb18030", "gbk": "gb18030",
    "windows-874": "cp874", "x-sjis": "shift_jis", "us-ascii": "ascii", "ansi_x3.4-1968": "ascii",
}
# What the statistical guess may choose from: the charsets real mail is written in. Left
# open, the detector confuses KOI8-R with Shift_JIS and the like.
GUESSES = ["cp1252", "koi8_r", "cp1251", "shift_jis", "euc_jp", "gb18030", "big5", "euc_kr",
           "cp1250", "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp874"]
LATIN = {"ascii", "latin-1", "iso8859-1", "iso8859-15", "cp1252", "iso8859-2", "cp1250"}


def normalise(declared: str | None) -> str | None:
    """The Python codec name for a declared charset, or None when it is unusable."""
    if not declared:
        return None
    label = declared.strip().strip("\"'").strip().lower()
    if label in ALIASES:
        label = ALIASES[label]
        if label is None:
            return None
    try:
        info = codecs.lookup(label)
    except (LookupError, ValueError):
        return None
    if not getattr(info, "_is_text_encoding", True):
        return None  # "base64", "zip" and friends are codecs but not charsets
    return info.name


def decode(data: bytes, declared: str | None = None) -> str:
    """The text of `data`: see the module docstring for the order of guesses."""
    if not data:
        return ""
    charset = normalise(declared)
    if charset is not None:
        if charset in LATIN and not data.isascii():
            try:
                return data.decode("utf-8")
            except UnicodeDecodeError:
                pass
        try:
            return data.decode(charset)
        except (UnicodeDecodeError, LookupError):
            pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    sample = data[:200_000]
    mostly_8bit = sum(b > 0x7F for b in sample) > len(sample) // 5
    guess = from_bytes(sample, cp_isolation=GUESSES).best() if mostly_8bit else None
    if guess is not None and guess.encoding:
        try:
            return data.decode(guess.encoding)
        except (UnicodeDecodeError, LookupError):
            pass
    return data.decode("cp1252", errors="replace")
