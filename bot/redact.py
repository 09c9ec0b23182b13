"""Secrets out of text before it is shown or logged: the configured ones by value, the
rest by shape. A leaf module: every error path uses it, the fast-starting reading commands
included, so it imports nothing of Steward's."""

import re
from collections.abc import Iterable
from urllib.parse import quote

# What looks like a secret, whatever config it came from. Each alternative is one shape;
# a named value (`api_key=`, `Authorization: Bearer`) keeps its name, loses its value.
_VALUE = r"[^\s\"'&,;)]+"
_SECRET = re.compile(
    # a JSON Web Token: base64url header (`{"` is always `eyJ`), payload, signature
    r"\beyJ[\w-]+\.[\w-]+\.[\w-]*"
    # a provider's prefixed key, however short (a proxy's `sk-1234`), masked ones too
    r"|(?<![\w-])(?:sk|pk|rk|gh[pousr]|github_pat|glpat|hf|xox[abeoprs]|xapp)[-_]"
    r"[\w\-*.]*[\w*]"
    # a long opaque run of key characters, letters and digits mixed (not a long word in
    # a path)
    r"|\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{32,}\b", re.ASCII)
_NAMED = re.compile(
    r"(?<![\w-])((?:x-)?(?:api[-_]?key|apikey|key|access[-_]?token|auth[-_]?token|token"
    r"|client[-_]?secret|secret|password|passwd|pwd|authorization)[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?:bearer|basic|token)\s+)?)" + _VALUE, re.IGNORECASE | re.ASCII)
_SCHEME = re.compile(r"(\b(?i:bearer)\s+)[\w.~+/=-]+|(\bBasic\s+)[A-Za-z0-9+/]{8,}=*",
                     re.ASCII)
MIN_KNOWN = 4  # a configured secret shorter than this would take out ordinary words

def redact(text: str, known: Iterable[str] = ()) -> str:
    """`text` without secrets: first the `known` ones (the values the config reads: API
    keys, tokens, passwords) wherever they appear verbatim or URL-encoded, then anything
    shaped like a key, a token or a named credential."""
    for secret in sorted({k.strip() for k in known if len(k.strip()) >= MIN_KNOWN},
                         key=len, reverse=True):  # a longer one may contain a shorter
        for form in {secret, quote(secret, safe="")}:
            text = text.replace(form, "[redacted]")
    text = _NAMED.sub(r"\1[redacted]", text)
    text = _SCHEME.sub(lambda m: (m[1] or m[2]) + "[redacted]", text)
    return _SECRET.sub("[redacted]", text)
