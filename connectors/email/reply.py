"""The reply as it goes out: threaded (In-Reply-To, the full References chain, one "Re:"),
marked `Auto-Submitted: auto-replied` (RFC 3834) and carrying a Message-ID derived from
the delivery's idempotency key, so it exists before the send and is the same on every try.
The id also carries the conversation id: a client that keeps only In-Reply-To still lands
its answer in the right thread."""

import re
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import formataddr, formatdate

from bot.channels import Outbound
from connectors.email.threads import reply_subject

# CRLF, folded only past RFC 5322's hard limit: a short line limit folds References before
# its first id, which some clients read as an empty header.
POLICY = SMTP.clone(max_line_length=998)


def reply_message_id(message: Outbound, address: str) -> str:
    """`<c{conversation id}.{key}@{domain of the address}>`, without the angle brackets."""
    domain = address.rpartition("@")[2] or "steward.invalid"
    key = re.sub(r"[^A-Za-z0-9._-]", "-", message.key)
    return f"c{message.conversation_id}.{key}@{domain}"


def build_reply(message: Outbound, *, address: str, name: str) -> tuple[str, bytes]:
    """(Message-ID, the bytes to send and to keep in Sent)."""
    to = message.reply_to
    message_id = reply_message_id(message, address)
    msg = EmailMessage(policy=POLICY)
    msg["From"] = formataddr((name, address))
    msg["To"] = formataddr((to.get("to_name") or "", to["to"]))
    msg["Subject"] = reply_subject(to.get("subject") or "")
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = f"<{message_id}>"
    parent = to.get("message_id")
    chain = [r for r in to.get("references") or [] if r != parent]
    if parent:
        msg["In-Reply-To"] = f"<{parent}>"
        chain.append(parent)
    if chain:
        msg["References"] = " ".join(f"<{r}>" for r in chain)
    msg["Auto-Submitted"] = "auto-replied"
    msg.set_content(message.text or "(empty answer)")
    return message_id, msg.as_bytes()
