"""What the person is told when the model gave no answer: short and generic. The
provider's own error text never reaches a channel (it can echo a request, or a masked key's
tail, into a shared channel); it goes to the log, with anything that looks like a secret
taken out."""

import logging
import re
from collections.abc import Iterable
from urllib.parse import quote

from bot.runtime.errors import POISON

log = logging.getLogger(__name__)

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

_BY_TYPE = {
    "RateLimited": "the model provider is limiting how often I may ask",
    "ServerError": "the model provider is having trouble right now",
    "StreamError": "the model provider could not be reached",
    "Unreachable": "the model provider could not be reached",
    "AuthError": "the model provider refused my credentials (check the API key",
    "RequestError": "the model provider refused the request",
    "ContextOverflow": "the conversation no longer fits the model's context window",
}


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


def apology(result: dict, error: str | None, state: str, *, failure: str | None = None
            ) -> str:
    """The answer for an LLM call that ended without a reply (`result` of the llm_call
    task, or its `error`, `state` and `failure` kind when it failed outright)."""
    detail = result.get("error") or error or state
    log.warning("the model gave no answer (%s): %s", result.get("error_type") or state,
                redact(str(detail)))
    if failure == POISON:
        reason = "asking the model made Steward crash each time it tried"
    else:
        reason = _BY_TYPE.get(result.get("error_type") or "",
                              "something went wrong on my side (the log says what)")
    if result.get("error_type") == "AuthError":  # a variable's name is no secret
        key_env = result.get("key_env")
        reason += f" in the environment variable {key_env})" if key_env else ")"
    text = f"Sorry, I could not get an answer from the model: {reason}."
    if result.get("retry_after"):  # a rate limit longer than retries wait out
        minutes = max(1, round(result["retry_after"] / 60))
        text += f" The provider asks me to wait about {minutes} minute" \
                f"{'s' if minutes > 1 else ''}; please ask again then."
    return text
