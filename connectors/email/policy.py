"""Who gets an answer. Steward drops its own and automatic mail first (RFC 3834: never
answer an auto-reply, a bounce or a list), then answers only allowed senders, and, when
asked to, only mail whose Authentication-Results says it really comes from them.

`refusal(mail, config)` is None for mail to answer, else the reason it is not answered.
"""

import re

from connectors.email import authres, headers
from connectors.email.config import EmailConfig
from connectors.email.parse import Mail

DAEMONS = re.compile(r"^(mailer-daemon|postmaster|listserv|majordomo|owner-.+|.+-request"
                     r"|no-?reply|do-?not-?reply|bounces?(\+.*)?|.+-bounces(\+.*)?)$")
BULK = {"bulk", "list", "junk"}
AUTO_HEADERS = ("X-Autoreply", "X-Autorespond", "X-Auto-Response")


def refusal(mail: Mail, config: EmailConfig) -> str | None:
    reason = own_mail(mail, config) or automatic(mail) or not_allowed(mail, config)
    if reason is None and config.require_auth_results:
        reason = unauthenticated(mail, config.authserv_id)
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


def unauthenticated(mail: Mail, authserv_id: str) -> str | None:
    """The topmost Authentication-Results header written by the receiving server (its
    authserv-id, `[email] authserv_id`; headers with any other id were written by someone
    else and are ignored) must show DMARC pass, or DKIM pass for the From domain."""
    ours = authserv_id.strip().lower().rstrip(".")
    found = [authres.parse(headers.text(raw))
             for raw in headers.all_raw(mail.msg, "Authentication-Results")]
    results = next((r for server, r in found if server == ours), None)
    if results is None:
        return f"no Authentication-Results header from {authserv_id}"
    domain = mail.sender.rpartition("@")[2]
    if any(r.method == "dmarc" and r.result == "fail" for r in results):
        return "Authentication-Results: dmarc=fail"
    for r in results:
        if r.result != "pass":
            continue
        if r.method == "dmarc":
            return None
        signer = (r.props.get("header.d") or r.props.get("header.i") or "").lstrip("@")
        if r.method == "dkim" and signer and _aligned(signer.rpartition("@")[2], domain):
            return None
    return "Authentication-Results shows no DMARC pass or aligned DKIM pass"


def _aligned(signer: str, domain: str) -> bool:
    signer = signer.lower().rstrip(".")
    return domain == signer or domain.endswith("." + signer)
