"""The message as it goes out, with a Message-ID derived from the delivery's idempotency
key, so it exists before the send and is the same on every try. The id also carries the
conversation id, checked by a tag of the conversation's key: a client that keeps only
In-Reply-To still lands its answer in the right thread, and a number another home gave
(the predecessor of a restored one) names no thread here.

Two kinds, told apart by what the delivery carries in `reply_to`:

- a reply to a mail Steward took in (its `reply_to` names that mail: the key `message_id`
  is there, None for mail that had no Message-ID): threaded with In-Reply-To and the full
  References chain, one "Re:", `Auto-Submitted: auto-replied` (RFC 3834);
- anything else (a scheduled message sent to an address: `{"to", "subject"}`): a new
  thread with its own subject, no In-Reply-To or References, and `Auto-Submitted:
  auto-generated`, since it answers nothing.
"""

import re
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import formataddr, formatdate
from typing import Any

from bot.port import Outbound
from connectors.email.threads import OWN_ID, reply_subject, thread_tag

# CRLF, folded only past RFC 5322's hard limit: a short line limit folds References before
# its first id, which some clients read as an empty header.
POLICY = SMTP.clone(max_line_length=998)
MAX_SUBJECT = 200


def reply_message_id(message: Outbound, address: str) -> str:
    """`<c{conversation id}-{tag of its key}.{key}@{domain of the address}>`, without the
    angle brackets (the conversation id lets a reply to it find its thread: threads.py)."""
    domain = address.rpartition("@")[2] or "steward.invalid"
    key = re.sub(r"[^A-Za-z0-9._-]", "-", message.key)
    tag = thread_tag(message.conversation_key)
    return f"c{message.conversation_id}-{tag}.{key}@{domain}"


def sent_search(message_id: str) -> str:
    """What to look for in Sent's Message-IDs: the whole id, or for an answer keyed by the
    mail it answers (`in.`, bot.agent.inbox.answer_key) the part after the conversation id,
    which a home restored from a backup may number differently: its predecessor's reply is
    found whatever number it had (IMAP matches a header's text anywhere in it)."""
    own = OWN_ID.match(message_id)
    if own and own.group("key").startswith("in."):
        return f".{own.group('key')}@{own.group('domain')}>"
    return f"<{message_id}>"


ANSWERS = "X-Steward-Answers"  # the mails a reply answers, when more than its parent


def answers_to(message: Outbound) -> list[str]:
    """The Message-IDs of the mails an answer covers (bot/agent/deliver.py `covers`)."""
    return [d["email"]["message_id"] for d in message.covers
            if isinstance(d.get("email"), dict) and d["email"].get("message_id")]


def answers_a_mail(reply_to: dict[str, Any]) -> bool:
    """Whether the delivery answers a mail (the intake records which one, even when it had
    no Message-ID), rather than starting a thread of its own."""
    return "message_id" in reply_to or bool(reply_to.get("references"))


def new_thread_subject(subject: str | None, name: str) -> str:
    subject = " ".join((subject or "").split())
    return subject[:MAX_SUBJECT] or f"A message from {name}"


def build_reply(message: Outbound, *, address: str, name: str) -> tuple[str, bytes]:
    """(Message-ID, the bytes to send and to keep in Sent)."""
    to = message.reply_to
    message_id = reply_message_id(message, address)
    msg = EmailMessage(policy=POLICY)
    msg["From"] = formataddr((name, address))
    msg["To"] = formataddr((to.get("to_name") or "", to["to"]))
    reply = answers_a_mail(to)
    msg["Subject"] = (reply_subject(to.get("subject") or "") if reply
                      else new_thread_subject(to.get("subject"), name))
    msg["Date"] = formatdate(usegmt=True)
    msg["Message-ID"] = f"<{message_id}>"
    if reply:
        parent = to.get("message_id")
        chain = [r for r in to.get("references") or [] if r != parent]
        if parent:
            msg["In-Reply-To"] = f"<{parent}>"
            chain.append(parent)
        if chain:
            msg["References"] = " ".join(f"<{r}>" for r in chain)
        msg["Auto-Submitted"] = "auto-replied"
        if len(answered := answers_to(message)) > 1:  # follow-ups it took in: for a restore
            msg[ANSWERS] = " ".join(f"<{m}>" for m in answered)
    else:
        msg["Auto-Submitted"] = "auto-generated"
    msg.set_content(message.text or "(empty answer)")
    return message_id, msg.as_bytes()
