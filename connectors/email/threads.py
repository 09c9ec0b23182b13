"""One conversation per email thread (`email:<root message-id>`), never one per sender.

The root is found, in order: through a message of the chain Steward already knows (its
submission names the conversation, or it is one of Steward's own replies, whose Message-ID
carries the conversation id and a tag of its key: a number that names another thread here,
as one given by the predecessor of a restored home can, is passed over); else the first id
in References (clients keep it when they shorten the chain); else In-Reply-To; else the
message's own id, starting a new thread; a message without any ids is keyed by its sender
and normalised subject. A conversation belongs to the person who started it (see
`conversation_key`).
"""

import hashlib
import re

from bot.port import AgentPort
from connectors.email.headers import clip
from connectors.email.parse import Mail

CHANNEL = "email"
PREFIX = re.compile(r"^\s*((re|aw|sv|antw|fwd?|wg|tr)\s*(\[\d+\])?\s*:\s*)+", re.IGNORECASE)
REPLY_PREFIX = re.compile(r"^\s*(re|aw|sv|antw)\s*(\[\d+\])?\s*:", re.IGNORECASE)
# Steward's own Message-IDs (reply.py); the tag is missing from those sent before it was.
OWN_ID = re.compile(
    r"^c(?P<id>\d+)(?:-(?P<tag>[0-9a-f]{8}))?\.(?P<key>[^@]+)@(?P<domain>.+)$")
LOOKUPS = 10  # ids of a long References chain checked against the store


def normalised_subject(subject: str) -> str:
    return " ".join(PREFIX.sub("", subject).lower().split())


def reply_subject(subject: str) -> str:
    """"Re: " once: a subject that already is a reply keeps its prefix."""
    subject = subject.strip() or "(no subject)"
    return subject if REPLY_PREFIX.match(subject) else f"Re: {subject}"


def thread_tag(conversation_key: str) -> str:
    """Eight hex digits of the key's hash: what checks the number in an own Message-ID."""
    return hashlib.sha256(conversation_key.encode("utf-8", "replace")).hexdigest()[:8]


def chain(mail: Mail) -> list[str]:
    """References then In-Reply-To, oldest first, without repeats."""
    ids: list[str] = []
    for identifier in [*mail.references, *mail.in_reply_to]:
        if identifier not in ids:
            ids.append(identifier)
    return ids


async def conversation_key(port: AgentPort, mail: Mail, own_domain: str) -> str:
    """The thread's conversation, if it is the sender's own; a thread someone else started
    with Steward gets a conversation per sender, so nobody reads another person's answers
    by replying to (or forging a reference to) their thread."""
    key = await _thread_key(port, mail, own_domain)
    conversation = await port.conversation(key)
    if conversation is None or conversation.owner in (None, mail.sender):
        return key
    return f"{CHANNEL}:" + clip(f"{key.removeprefix(CHANNEL + ':')}/from:{mail.sender}")


async def _thread_key(port: AgentPort, mail: Mail, own_domain: str) -> str:
    ids = chain(mail)
    candidates = ids[:1] + ids[1:][-(LOOKUPS - 1):]
    for identifier in reversed(candidates):  # the nearest known ancestor decides
        key = await _known(port, identifier, own_domain)
        if key is not None:
            return key
    if ids:
        return f"{CHANNEL}:{ids[0]}"
    if mail.message_id:
        return f"{CHANNEL}:{mail.message_id}"
    digest = hashlib.sha256(f"{mail.sender}\n{normalised_subject(mail.subject)}".encode(
        "utf-8", "replace")).hexdigest()[:24]
    return f"{CHANNEL}:no-id:{digest}"


async def _known(port: AgentPort, identifier: str, own_domain: str) -> str | None:
    own = OWN_ID.match(identifier)
    conversation_id = None
    if own and own.group("domain").lower() == own_domain.lower():
        conversation_id = int(own.group("id"))
    else:
        row = await port.submission(CHANNEL, f"msgid:{identifier}")
        conversation_id = row["conversation_id"] if row else None
    if conversation_id is None:
        return None
    conversation = await port.conversation_by_id(conversation_id)
    if conversation is None:
        return None
    if own and own.group("tag") and own.group("tag") != thread_tag(conversation.key):
        return None
    return clip(conversation.key)
