"""Taking one fetched message: parse it, decide, and commit what it means together with
the cursor move past it — a turn that will answer it, a record of why it is not answered,
or a quarantine entry with the reason. One transaction per message; a message that was
already taken (the same Message-ID under a new UIDVALIDITY) only moves the cursor.
"""

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable

from bot.port import AgentPort, Kept
from bot.runtime.killpoints import kill_point
from connectors.email import cursor as cursors
from connectors.email.config import EmailConfig
from connectors.email.headers import MSG_ID
from connectors.email.parse import Mail, Unparsable, parse_mail
from connectors.email.policy import refusal
from connectors.email.render import render
from connectors.email.threads import CHANNEL, chain, conversation_key

log = logging.getLogger(__name__)

THREAD_PARSE_BYTES = 256_000  # bigger messages are parsed off the event loop
MAX_REFERENCES = 20


class Intake:
    def __init__(self, port: AgentPort, config: EmailConfig,
                 answered: Callable[[str], Awaitable[bool]] | None = None):
        self.port = port
        self.config = config
        self.answered = answered  # whether Sent holds a reply to a mail (EmailChannel)
        self.domain = config.address.rpartition("@")[2].lower()

    async def take(self, cursor: cursors.Cursor, uid: int,
                   raw: bytes | None) -> tuple[str, cursors.Cursor]:
        """Commit message `uid` (None: it vanished) and the cursor past it; returns what
        happened ("accepted", "skipped", "quarantined", "duplicate", "gone") and the new
        cursor."""
        moved = cursor.past(uid)
        imap_id = f"imap:{cursor.uidvalidity}:{uid}"
        if raw is None:
            await self.port.advance(self._at(moved))
            return "gone", moved
        kill_point("email-fetched", "email")
        try:
            mail, digest = await self._parse(raw)
        except Unparsable as exc:
            return await self._quarantine(moved, imap_id, raw, str(exc)), moved
        except Exception as exc:  # a bug must not block the mailbox
            log.exception("email: parsing failed on %s", imap_id)
            reason = f"parsing failed: {type(exc).__name__}: {exc}"
            return await self._quarantine(moved, imap_id, raw, reason), moved
        ids = [f"msgid:{mail.message_id}" if mail.message_id else f"sha256:{digest}", imap_id]
        try:
            reason = refusal(mail, self.config)
        except Exception as exc:  # a bug must not block the mailbox
            log.exception("email: safety check failed on %s", imap_id)
            return await self._quarantine(moved, imap_id, raw, f"safety check failed: {exc}"), moved
        if reason is not None:
            new = await self.port.skip(CHANNEL, ids, {"skipped": reason, "from": mail.sender,
                                                      "subject": mail.subject[:200]},
                                       at=self._at(moved))
            outcome = "skipped" if new else self._taken_before()
            log.info("email: %s from %s not answered: %s", imap_id, mail.sender, reason)
            return outcome, moved
        return await self._accept(mail, ids, digest, moved), moved

    async def commit_cursor(self, cursor: cursors.Cursor) -> None:
        await self.port.advance(self._at(cursor))

    async def cursor(self, mailbox: str) -> cursors.Cursor | None:
        return await cursors.load(self.port, self.config.address, mailbox)

    def _at(self, cursor: cursors.Cursor):
        return cursors.position(self.config.address, self.config.mailbox, cursor)

    async def unreadable(self, cursor: cursors.Cursor, uid: int, reason: str, *,
                         raw: bytes = b""):
        """Quarantine message `uid` without taking it (too large, no body returned, failed
        every try); `raw`, if it was fetched, is kept in part with the reason."""
        moved = cursor.past(uid)
        imap_id = f"imap:{cursor.uidvalidity}:{uid}"
        return await self._quarantine(moved, imap_id, raw, reason), moved

    async def _parse(self, raw: bytes) -> tuple[Mail, str]:
        def work():
            return (parse_mail(raw, max_attachment_bytes=self.config.max_attachment_bytes),
                    hashlib.sha256(raw).hexdigest())
        if len(raw) > THREAD_PARSE_BYTES:
            return await asyncio.to_thread(work)
        return work()

    async def _accept(self, mail: Mail, ids: list[str], digest: str,
                      moved: cursors.Cursor) -> str:
        key = await conversation_key(self.port, mail, self.domain)
        kept = await self._keep(mail)  # stored before the commit that refers to them
        kill_point("email-kept", "email")
        try:
            rendered = render(mail, doc_prefix=f"email-attachment:{digest[:24]}",
                              max_attachment_bytes=self.config.max_attachment_bytes, kept=kept)
        except Exception as exc:  # a bug must not block the mailbox
            log.exception("email: rendering failed on %s", ids[1])
            return await self._quarantine(moved, ids[1], b"", f"rendering failed: {exc}")
        references = chain(mail)
        if len(references) > MAX_REFERENCES:
            references = references[:1] + references[-(MAX_REFERENCES - 1):]
        reply_to = {"to": mail.sender, "to_name": mail.sender_name, "subject": mail.subject,
                    "message_id": mail.message_id, "references": references}
        if self.answered is not None and mail.message_id and self.port.reconciling() \
                and await self.answered(mail.message_id):
            # A home restored from a backup reads again what came in since the snapshot;
            # what the home before it answered has its reply in Sent.
            await self.port.skip(CHANNEL, ids, {"skipped": "answered before the restore",
                                                "from": mail.sender,
                                                "subject": mail.subject[:200]},
                                 at=self._at(moved))
            log.info("email: %s from %s was answered before the restore", ids[1], mail.sender)
            return "skipped"
        accepted = await self.port.submit(
            channel=CHANNEL, external_ids=ids, conversation_key=key, text=rendered.text,
            author=mail.sender, owner=mail.sender, reply_to=reply_to, data=rendered.data,
            files=rendered.documents, at=self._at(moved))
        if accepted.duplicate:  # taken before, or an answer to an approval: no turn
            return "duplicate"
        log.info("email: %s from %s accepted into %s", ids[1], mail.sender, key)
        return "accepted"

    async def _keep(self, mail: Mail) -> list[Kept | None]:
        """Each attachment within the cap read and stored (an image for the model, a
        document's text); bad files come back as notes, never as errors."""
        return [None if att.data is None else
                await self.port.keep(att.data, name=att.filename, media_type=att.content_type)
                for att in mail.attachments]

    async def _quarantine(self, moved: cursors.Cursor, imap_id: str, raw: bytes,
                          reason: str) -> str:
        payload = {"size": len(raw), "head": raw[:2000].decode("utf-8", "replace")}
        ids = [imap_id]
        found = MSG_ID.search(_message_id_line(raw))
        if found:  # recognised again after a UIDVALIDITY change
            ids.append(f"msgid:{found.group(1)[:400]}")
        if not await self.port.quarantine(CHANNEL, ids, reason, payload, at=self._at(moved)):
            return self._taken_before()
        log.warning("email: %s quarantined: %s", imap_id, reason)
        return "quarantined"

    def _taken_before(self) -> str:
        """The port moved the cursor past it all the same."""
        log.info("email: a message of %s was taken before (same Message-ID): not again",
                 self.config.mailbox)
        return "duplicate"


def _message_id_line(raw: bytes) -> str:
    head = raw[:64_000].split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    for line in head.decode("utf-8", "replace").splitlines():
        if line.lower().startswith("message-id:"):
            return line
    return ""
