"""Email as a delivery channel: the answer goes out as a threaded reply, and Sent is the
journal that tells, after a crash, whether it already went.

    1. SMTP envelope accepted (MAIL, RCPT)        kill point `smtp-connected`
    2. the reply is appended to Sent, flagged `$StewardSending`
    3. NOOP (still there?), then DATA             kill point `smtp-sent`
    4. the flag is removed: the Sent copy is final   kill point `sent-appended`

`find` (asked after a crash mid-send, or after a send in doubt) looks the Message-ID up in
Sent. Absent: the crash came before step 2, so DATA was never sent (an SMTP server drops a
transaction whose client went away before the final dot) and the message is sent now.
Present and final: sent. Present and still flagged: the crash came between 2 and 4, which
cannot be told apart from here; it is taken as sent, because a message sent twice is what
must never happen, and logged. The window where that guess is wrong is the DATA exchange
itself (step 2 to the server's answer to DATA).

How a send that fails without a crash ends, in the runtime's terms:
- certainly not sent (IMAP or SMTP unreachable, the envelope or the data refused, the
  SMTP connection gone before DATA): the journal copy, if any, is removed and
  `NotPerformed` is raised: tried again later;
- the connection died during DATA (`smtp.InDoubt`): the copy stays flagged and
  `Unavailable` is raised, so the delivery is reconciled before anything else: `find` sees
  the flagged copy and takes it as sent in doubt, exactly as after a crash, never twice;
- IMAP down while `find` looks: `Unavailable`, retried for the outage budget.
"""

import logging
import ssl

from bot.channels import Outbound
from bot.config import EmailConfig
from bot.runtime import NotPerformed, Unavailable
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
        except smtp.InDoubt as exc:
            # The server may have taken it: the flagged copy in Sent stays, and the
            # reconcile that comes before any retry takes it as sent.
            log.warning("email: the SMTP connection died during DATA of <%s>; it may have "
                        "gone out: %s", message_id, exc)
            raise Unavailable(f"SMTP connection lost during DATA, sent in doubt: {exc}") \
                from exc
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
        sent = self.config.sent_mailbox
        try:
            await imap.select(sent)
        except ImapError:
            if not await imap.exists(sent):  # nothing was ever journaled there
                return []
            raise
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
        try:
            async with self.open_session() as imap:
                uids = await self._copies(imap, message_id)
                if not uids:
                    return None
                flagged = [u for u in uids if SENDING in await imap.flags(u)]
                in_doubt = len(flagged) == len(uids)
                if in_doubt:
                    log.warning("email: message <%s> was being sent when it was cut off; "
                                "it is taken as sent and not repeated (its copy is in %s)",
                                message_id, self.config.sent_mailbox)
                for uid in flagged:
                    await imap.set_flags(uid, SENDING, add=False)
        except (*CONNECTION_ERRORS, ImapError) as exc:
            raise Unavailable(f"IMAP unavailable to look for <{message_id}> in "
                              f"{self.config.sent_mailbox}: {exc}") from exc
        return {"message_id": message_id, "to": message.reply_to.get("to"),
                "found_in": self.config.sent_mailbox, "in_doubt": in_doubt}
