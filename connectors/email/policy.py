"""Who gets an answer. Steward drops its own and automatic mail first (RFC 3834: never
answer an auto-reply, a bounce or a list), then mail whose From is ambiguous (two
addresses), then answers only allowed senders, and only when the receiving server's
Authentication-Results (`authres`) do not record that the sender failed authentication
(`refuse_failed_auth`, on by default) — and, when asked to, only when they record a pass
(`require_auth_results`).

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
    reason = (own_mail(mail, config) or automatic(mail) or ambiguous_sender(mail)
              or not_allowed(mail, config))
    if reason is None and (config.refuse_failed_auth or config.require_auth_results):
        server = authres.receiver(config.authserv_id, config.imap_host)
        found = verdict(mail, server)
        if config.refuse_failed_auth:
            reason = failed_auth(found, mail.sender)
        if reason is None and config.require_auth_results:  # a pass from a known server only
            reason = unproven(found if server else authres.Verdict(None, False, {}), mail.sender)
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


def ambiguous_sender(mail: Mail) -> str | None:
    """A From with two addresses (or two From headers) names no one sender: which one
    would the answer, the allowed-senders check and DMARC be about?"""
    if len(set(mail.from_addresses) | {mail.sender}) > 1:
        named = list(dict.fromkeys([*mail.from_addresses, mail.sender]))
        shown = ", ".join(named[:3]) + (", ..." if len(named) > 3 else "")
        return f"ambiguous sender: From names {len(named)} addresses ({shown})"
    return None


def not_allowed(mail: Mail, config: EmailConfig) -> str | None:
    return None if sender_allowed(mail.sender, config) else f"sender {mail.sender} not allowed"


def verdict(mail: Mail, server: authres.Receiver | None) -> authres.Verdict:
    """The receiving server's Authentication-Results (`server` None: the server that wrote
    the topmost header)."""
    values = [headers.text(raw) for raw in headers.all_raw(mail.msg, "Authentication-Results")]
    return authres.verdict(values, server)


def failed_auth(found: authres.Verdict, sender: str) -> str | None:
    """An explicit failure the receiving server recorded: DMARC failed, or SPF failed with
    no DKIM pass for the From domain. None when it recorded none, or wrote no header."""
    if any(r.result == "fail" for r in found.results("dmarc")):
        return (f"sender not authenticated: {found.by('dmarc')} recorded dmarc=fail for "
                f"{sender} (refuse_failed_auth)")
    if any(r.result == "pass" for r in found.results("dmarc")):
        return None
    if any(r.result == "fail" for r in found.results("spf")) and not _dkim_pass(found, sender):
        return (f"sender not authenticated: {found.by('spf')} recorded spf=fail and no DKIM "
                f"pass for {sender} (refuse_failed_auth)")
    return None


def unproven(found: authres.Verdict, sender: str) -> str | None:
    """`require_auth_results`: the receiving server's headers must show DMARC pass, or DKIM
    pass for the From domain. Its headers are the ones of `[email] authserv_id` or of the
    IMAP host's provider (config.py makes sure one of them is known)."""
    if not found.found:
        name = found.receiver.name if found.receiver else "the receiving server"
        return f"no Authentication-Results header from {name}"
    if any(r.result == "fail" for r in found.results("dmarc")):
        return "Authentication-Results: dmarc=fail"
    if any(r.result == "pass" for r in found.results("dmarc")) or _dkim_pass(found, sender):
        return None
    return "Authentication-Results shows no DMARC pass or aligned DKIM pass"


def unauthenticated(mail: Mail, authserv_id: str) -> str | None:
    """`unproven` for the server named `authserv_id`."""
    return unproven(verdict(mail, authres.receiver(authserv_id, "")), mail.sender)


def _dkim_pass(found: authres.Verdict, sender: str) -> bool:
    domain = sender.rpartition("@")[2]
    for r in found.results("dkim"):
        signer = (r.props.get("header.d") or r.props.get("header.i") or "").lstrip("@")
        if r.result == "pass" and signer and _aligned(signer.rpartition("@")[2], domain):
            return True
    return False


def _aligned(signer: str, domain: str) -> bool:
    """Relaxed alignment, near enough: one domain is the other or a subdomain of it."""
    signer, domain = signer.lower().rstrip("."), domain.lower().rstrip(".")
    return (domain == signer or domain.endswith("." + signer)
            or ("." in domain and signer.endswith("." + domain)))
