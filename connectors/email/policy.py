"""Who gets an answer. Steward drops its own and automatic mail first (RFC 3834: never
answer an auto-reply, a bounce or a list), then answers only allowed senders, and, when
asked to, only mail whose Authentication-Results says it really comes from them.

`refusal(mail, config)` is None for mail to answer, else the reason it is not answered.
"""

import re

from bot.config import EmailConfig
from connectors.email import headers
from connectors.email.parse import Mail

DAEMONS = re.compile(r"^(mailer-daemon|postmaster|listserv|majordomo|owner-.+|.+-request"
                     r"|no-?reply|do-?not-?reply|bounces?(\+.*)?|.+-bounces(\+.*)?)$")
BULK = {"bulk", "list", "junk"}
AUTO_HEADERS = ("X-Autoreply", "X-Autorespond", "X-Auto-Response")


def refusal(mail: Mail, config: EmailConfig) -> str | None:
    reason = own_mail(mail, config) or automatic(mail) or not_allowed(mail, config)
    if reason is None and config.require_auth_results:
        reason = unauthenticated(mail)
    return reason


def own_mail(mail: Mail, config: EmailConfig) -> str | None:
    if mail.sender == config.address.strip().lower():
        return "mail from Steward's own address"
    return None


def automatic(mail: Mail) -> str | None:
    msg = mail.msg
    auto = headers.header(msg, "Auto-Submitted").split(";")[0].strip().lower()
    if auto and auto != "no":
        return f"Auto-Submitted: {auto}"
    precedence = headers.header(msg, "Precedence").strip().lower()
    if precedence in BULK:
        return f"Precedence: {precedence}"
    for name in ("List-Id", "List-Unsubscribe", "List-Post"):
        if headers.raw(msg, name) is not None:
            return f"mailing-list mail ({name})"
    for name in AUTO_HEADERS:
        if headers.raw(msg, name) is not None:
            return f"automatic reply ({name})"
    return_path = headers.all_raw(msg, "Return-Path")
    if return_path and "".join(return_path[0].split()) in ("<>", ""):
        return "empty return path (a bounce)"
    if DAEMONS.match(mail.sender.split("@")[0]):
        return f"automated sender {mail.sender}"
    if (headers.raw(msg, "Content-Type") or "").lower().lstrip().startswith("multipart/report"):
        return "delivery or read report"
    return None


def sender_allowed(sender: str, config: EmailConfig) -> bool:
    """allowed_senders entries are addresses (any case) or whole domains ("@example.com")."""
    if config.allow_everyone:
        return True
    sender = sender.lower()
    domain = "@" + sender.rpartition("@")[2]
    for entry in config.allowed_senders:
        entry = entry.strip().lower()
        if entry and (entry == sender or (entry.startswith("@") and entry == domain)):
            return True
    return False


def not_allowed(mail: Mail, config: EmailConfig) -> str | None:
    return None if sender_allowed(mail.sender, config) else f"sender {mail.sender} not allowed"


RESULT = re.compile(r"\b(dkim|dmarc|spf)\s*=\s*([a-z]+)([^;]*)", re.IGNORECASE)


def unauthenticated(mail: Mail) -> str | None:
    """The topmost Authentication-Results header (the one the receiving server added; older
    ones may be forged) must show DMARC pass, or DKIM pass for the From domain."""
    found = headers.all_raw(mail.msg, "Authentication-Results")
    if not found:
        return "no Authentication-Results header"
    value = headers.text(found[0])
    domain = mail.sender.rpartition("@")[2]
    results = [(m.group(1).lower(), m.group(2).lower(), m.group(3).lower())
               for m in RESULT.finditer(value)]
    if any(method == "dmarc" and result == "fail" for method, result, _ in results):
        return "Authentication-Results: dmarc=fail"
    for method, result, props in results:
        if result != "pass":
            continue
        if method == "dmarc":
            return None
        signer = re.search(r"header\.(?:d|i)\s*=\s*@?([\w.-]+)", props)
        if method == "dkim" and signer and _aligned(signer.group(1), domain):
            return None
    return "Authentication-Results shows no DMARC pass or aligned DKIM pass"


def _aligned(signer: str, domain: str) -> bool:
    signer = signer.lower().rstrip(".")
    return domain == signer or domain.endswith("." + signer)
