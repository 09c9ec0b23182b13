"""Email as a delivery channel: the answer goes out as a threaded reply, and Sent is the
journal that tells, after a crash, whether it already went.

    1. SMTP envelope accepted (MAIL, RCPT)        kill point `smtp-connected`
    2. the reply is appended to Sent, flagged `$StewardSending`
    3. DATA                                       kill point `smtp-sent`
    4. the flag is removed: the Sent copy is final   kill point `sent-appended`

`find` (asked after a crash mid-send) looks the Message-ID up in Sent. Absent: the crash
came before step 2, so DATA was never sent (an SMTP server drops a transaction whose client
went away before the final dot) and the reply is sent now. Present and final: sent.
Present and still flagged: the crash came between 2 and 4, which cannot be told apart from
here; it is taken as sent, because a reply sent twice is what must never happen, and
logged. The window where that guess is wrong is the DATA exchange itself (step 2 to the
server's answer to DATA). A send the server certainly refused removes its journal copy and
raises `NotPerformed`, so the delivery is retried.
"""

import logging
import ssl

from bot.channels import Outbound
from bot.config import EmailConfig
from bot.runtime import NotPerformed
from bot.runtime.killpoints import kill_point
from connectors.email import smtp
from connectors.email.imap import CONNECTION_ERRORS, ImapError, ImapSession
from connectors.email.reply import build_reply, reply_message_id

log = logging.getLogger(__name__)

SENDING = "$StewardSending"


class EmailChannel:
    name = "email"

    def __init__(self, config: EmailConfig, *, open_session, smtp_password: str | None,
                 sender_name: str, ssl_context: ssl.SSLContext | None = None):
        self.config = config
        self.open_session = open_session  # () -> ImapSession (not yet opened)
        self.smtp_password = smtp_password
        self.sender_name = sender_name
        self.ssl_context = ssl_context

    async def send(self, message: Outbound) -> dict:
        message_id, data = build_reply(message, address=self.config.address,
                                       name=self.sender_name)
        recipient = message.reply_to["to"]
        session = self.open_session()
        try:
            await session.open()
        except (*CONNECTION_ERRORS, ImapError) as exc:
            await session.close()
            raise NotPerformed(f"IMAP (for the Sent journal) unavailable: {exc}") from exc
        try:
            return await self._send(session, message_id, data, recipient)
        finally:
            await session.close()

    async def _send(self, imap: ImapSession, message_id: str, data: bytes,
                    recipient: str) -> dict:
        sent = self.config.sent_mailbox
        journaled = False

        async def journal():
            nonlocal journaled
            kill_point("smtp-connected", "email")
            await imap.append(sent, data, f"\\Seen {SENDING}")
            journaled = True

        try:
            answer = await smtp.send(self.config, self.smtp_password,
                                     sender=self.config.address, recipients=[recipient],
                                     data=data, before_data=journal,
                                     ssl_context=self.ssl_context)
        except smtp.NotSent as exc:
            if journaled:
                await self._drop_journal(imap, message_id)
            raise NotPerformed(f"SMTP: {exc}") from exc
        except (*CONNECTION_ERRORS, ImapError) as exc:  # the journal append failed
            raise NotPerformed(f"IMAP append to {sent} failed: {exc}") from exc
        kill_point("smtp-sent", "email")
        try:
            await self._finalise(imap, message_id)
        except (*CONNECTION_ERRORS, ImapError) as exc:  # sent all the same
            log.warning("email: reply <%s> sent, but its Sent copy stays flagged: %s",
                        message_id, exc)
        kill_point("sent-appended", "email")
        return {"message_id": message_id, "to": recipient, "smtp": answer}

    async def _copies(self, imap: ImapSession, message_id: str) -> list[int]:
        await imap.select(self.config.sent_mailbox)
        return await imap.search("HEADER", "Message-ID", f'"<{message_id}>"')

    async def _finalise(self, imap: ImapSession, message_id: str) -> None:
        for uid in await self._copies(imap, message_id):
            await imap.set_flags(uid, SENDING, add=False)

    async def _drop_journal(self, imap: ImapSession, message_id: str) -> None:
        try:
            for uid in await self._copies(imap, message_id):
                await imap.delete(uid)
        except (*CONNECTION_ERRORS, ImapError) as exc:
            # Left flagged, `find` would take it for sent: fail loudly instead of retrying.
            raise RuntimeError(f"reply <{message_id}> was refused by SMTP and its journal "
                               f"copy in Sent could not be removed: {exc}") from exc

    async def find(self, message: Outbound) -> dict | None:
        message_id = reply_message_id(message, self.config.address)
        async with self.open_session() as imap:
            uids = await self._copies(imap, message_id)
            if not uids:
                return None
            flagged = [u for u in uids if SENDING in await imap.flags(u)]
            in_doubt = len(flagged) == len(uids)
            if in_doubt:
                log.warning("email: reply <%s> was being sent when Steward stopped; it is "
                            "taken as sent and not repeated (its copy is in %s)", message_id,
                            self.config.sent_mailbox)
            for uid in flagged:
                await imap.set_flags(uid, SENDING, add=False)
        return {"message_id": message_id, "to": message.reply_to.get("to"),
                "found_in": self.config.sent_mailbox, "in_doubt": in_doubt}
