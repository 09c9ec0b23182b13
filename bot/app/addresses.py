"""What a Slack member id and a mail address look like, for `steward init` (which asks
again) and `steward doctor` (which checks a file written by hand). The config loader takes
any text: a name where an id belongs is not malformed TOML, but it makes Steward refuse the
very person it was meant to answer, without a word to the owner.
"""

import re

# Slack's member ids: U (W in an Enterprise Grid) and capitals and digits, e.g. U012AB3CDE.
_MEMBER_ID = re.compile(r"[UW][A-Z0-9]{2,}")
# One @ between a local part and a domain, no spaces: what a person means by an address
# (the server says the rest).
_ADDRESS = re.compile(r"[^@\s]+@[^@\s.][^@\s]*")
_DOMAIN = re.compile(r"@[^@\s.][^@\s]*")

MEMBER_ID_HOW = "in Slack, open the person's profile, ⋮ (more), Copy member ID"


def member_id_problem(text: str) -> str | None:
    if _MEMBER_ID.fullmatch(text):
        return None
    return f"{text!r} is not a Slack member id (like U012AB3CDE: {MEMBER_ID_HOW})"


def address_problem(text: str) -> str | None:
    if _ADDRESS.fullmatch(text):
        return None
    return f"{text!r} is not an email address (like name@example.org)"


def sender_problem(text: str) -> str | None:
    """An address, or "@domain" for everyone at it."""
    if _ADDRESS.fullmatch(text) or _DOMAIN.fullmatch(text):
        return None
    return (f"{text!r} is neither an email address nor @domain (like ann@example.org or "
            "@example.org)")
