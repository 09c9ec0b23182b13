"""Taking one fetched message: parse it, decide, and commit what it means together with
the cursor move past it — a turn that will answer it, a record of why it is not answered,
or a quarantine entry with the reason. One transaction per message; a message that was
already taken (the same Message-ID under a new UIDVALIDITY) only moves the cursor.
"""

import asyncio
import hashlib
import logging

from bot.agent.inbox import submit_message
from bot.config import EmailConfig
from bot.runtime.killpoints import kill_point
from connectors.email import cursor as cursors
from connectors.email.headers import MSG_ID
from connectors.email.parse import Mail, Unparsable, parse_mail
from connectors.email.policy import refusal
from connectors.email.render import render
from connectors.email.threads import CHANNEL, chain, conversation_key
from store import Store, Writes, conversation_namespace

log = logging.getLogger(__name__)

THREAD_PARSE_BYTES = 256_000  # bigger messages are parsed off the event loop
MAX_REFERENCES = 20


class Intake:
    def __init__(self, store: Store, config: EmailConfig, wake=lambda: None):
        self.store = store
        self.config = config
        self.wake = wake
        self.domain = config.address.rpartition("@")[2].lower()

    async def take(self, cursor: cursors.Cursor, uid: int,
                   raw: bytes | None) -> tuple[str, cursors.Cursor]:
        """Commit message `uid` (None: it vanished) and the cursor past it; returns what
        happened ("accepted", "skipped", "quarantined", "duplicate", "gone") and the new
        cursor."""
        moved = cursor.past(uid)
        imap_id = f"imap:{cursor.uidvalidity}:{uid}"
        if raw is None:
            await self._commit(Writes(), moved)
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
            w = Writes()
            w.submit(CHANNEL, *ids, payload={"skipped": reason, "from": mail.sender,
                                             "subject": mail.subject[:200]})
            outcome = await self._commit(w, moved, "skipped")
            log.info("email: %s from %s not answered: %s", imap_id, mail.sender, reason)
            return outcome, moved
        return await self._accept(mail, ids, digest, moved), moved

    async def commit_cursor(self, cursor: cursors.Cursor) -> None:
        w = Writes()
        cursors.save(w, self.config.address, self.config.mailbox, cursor)
        await self.store.commit(w)

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
        key = await conversation_key(self.store, mail, self.domain)
        try:
            rendered = render(mail, doc_prefix=f"email-attachment:{digest[:24]}",
                              max_attachment_bytes=self.config.max_attachment_bytes)
        except Exception as exc:  # a bug must not block the mailbox
            log.exception("email: rendering failed on %s", ids[1])
            return await self._quarantine(moved, ids[1], b"", f"rendering failed: {exc}")
        references = chain(mail)
        if len(references) > MAX_REFERENCES:
            references = references[:1] + references[-(MAX_REFERENCES - 1):]
        reply_to = {"to": mail.sender, "to_name": mail.sender_name, "subject": mail.subject,
                    "message_id": mail.message_id, "references": references}
        def attachments_and_cursor(conversation, w: Writes) -> None:
            for name, value in rendered.documents:
                w.edit_document(conversation_namespace(conversation.id), name,
                                [{"op": "set", "path": [], "value": value}], history="latest",
                                fork_policy="current", conversation_id=conversation.id)
            cursors.save(w, self.config.address, self.config.mailbox, moved)

        accepted = await submit_message(
            self.store, channel=CHANNEL, external_ids=ids, conversation_key=key,
            text=rendered.text, author=mail.sender, owner=mail.sender, reply_to=reply_to,
            data=rendered.data, extra=attachments_and_cursor)
        if accepted.duplicate:
            return await self._commit(Writes(), moved, "duplicate")
        log.info("email: %s from %s accepted into %s", ids[1], mail.sender, key)
        self.wake()
        return "accepted"

    async def _quarantine(self, moved: cursors.Cursor, imap_id: str, raw: bytes,
                          reason: str) -> str:
        w = Writes()
        payload = {"size": len(raw), "head": raw[:2000].decode("utf-8", "replace")}
        w.quarantine(CHANNEL, imap_id, reason, payload)
        found = MSG_ID.search(_message_id_line(raw))
        if found:  # recognised again after a UIDVALIDITY change
            w.quarantine(CHANNEL, f"msgid:{found.group(1)[:400]}", reason, payload)
        outcome = await self._commit(w, moved, "quarantined")
        if outcome == "quarantined":
            log.warning("email: %s quarantined: %s", imap_id, reason)
        return outcome

    async def _commit(self, w: Writes, moved: cursors.Cursor, outcome: str = "gone") -> str:
        cursors.save(w, self.config.address, self.config.mailbox, moved)
        if not (await self.store.commit(w)).duplicate:
            return outcome
        only = Writes()  # taken before: the cursor still moves past it
        cursors.save(only, self.config.address, self.config.mailbox, moved)
        await self.store.commit(only)
        log.info("email: a message of %s was taken before (same Message-ID): not again",
                 self.config.mailbox)
        return "duplicate"


def _message_id_line(raw: bytes) -> str:
    head = raw[:64_000].split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    for line in head.decode("utf-8", "replace").splitlines():
        if line.lower().startswith("message-id:"):
            return line
    return ""
