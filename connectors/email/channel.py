"""Email as a delivery channel: the answer goes out as a threaded reply, and Sent is the
journal that tells, after a crash, whether it already went.

    1. SMTP envelope accepted (MAIL, RCPT)          kill point `smtp-connected`
    2. the reply is appended to Sent, flagged `$StewardQueued`   kill point `smtp-journaled`
    3. NOOP (still there?); DATA and the message's lines   kill point `smtp-data`;
       the copy is flagged `$StewardSending`; the final dot and the server's answer
                                                    kill point `smtp-sent` after it
    4. the flags are removed: the Sent copy is final   kill point `sent-appended`

`find` (asked after a crash mid-send, or after a send in doubt) looks the Message-ID up in
Sent. Absent, or only queued: the crash came before the final dot, and an SMTP server
drops a transaction whose client went away before it, so the message was not sent: a
queued copy is removed and the message is sent now. Present and final: sent. Present and
flagged as sending: the crash came after the flag, set just before the dot, and before
step 4; it is taken as sent (the server had the whole message), because a message sent
twice is what must never happen, and logged. The window where that guess can be wrong is
the few instructions between the flag and the dot leaving this process.

How a send that fails without a crash ends, in the runtime's terms:
- certainly not sent (IMAP or SMTP unreachable, the envelope or the data refused, the
  SMTP connection gone before the dot): the journal copy, if any, is removed and
  `NotPerformed` is raised: tried again later;
- the connection died after the dot, before the answer (`smtp.InDoubt`): the copy stays
  flagged and `Unavailable` is raised, so the delivery is reconciled before anything else:
  `find` sees the flagged copy and takes it as sent in doubt, as after a crash, never twice;
- IMAP down while `find` looks: `Unavailable`, retried for the outage budget.
"""

import contextlib
import logging
import ssl
from typing import Any

from bot.port import NotPerformed, Outbound, Unavailable, kill_point
from connectors.email import smtp
from connectors.email.config import EmailConfig
from connectors.email.imap import CONNECTION_ERRORS, ImapError, ImapSession
from connectors.email.reply import build_reply, reply_message_id

log = logging.getLogger(__name__)

QUEUED = "$StewardQueued"  # journaled, DATA not begun: not sent
SENDING = "$StewardSending"  # DATA begun: in doubt until the flag is removed


class EmailChannel:
    name = "email"

    def __init__(self, config: EmailConfig, *, open_session, smtp_password: str | None,
                 sender_name: str, ssl_context: ssl.SSLContext | None = None):
        self.config = config
        self.circle = tuple(config.allowed_senders)  # bot.tools.permissions: may be mailed
        self.open_session = open_session  # () -> ImapSession (not yet opened)
        self.smtp_password = smtp_password
        self.sender_name = sender_name
        self.ssl_context = ssl_context

    @staticmethod
    def address_of(address: str, *, subject: str) -> dict[str, Any]:
        """A new thread to `address` (a scheduled job's answers, say)."""
        return {"to": address, "subject": subject}

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
        journaled: list[int] = []  # the copy's uid
        appended = False

        async def journal():
            nonlocal appended
            kill_point("smtp-connected", "email")
            await imap.append(sent, data, f"\\Seen {QUEUED}")
            appended = True
            journaled[:] = await self._copies(imap, message_id)
            kill_point("smtp-journaled", "email")

        async def sending():  # the last thing before the final dot
            kill_point("smtp-data", "email")  # the lines are sent, the dot is not
            for uid in journaled:
                await imap.set_flags(uid, SENDING, add=True)

        try:
            answer = await smtp.send(self.config, self.smtp_password,
                                     sender=self.config.address, recipients=[recipient],
                                     data=data, before_data=journal, at_data=sending,
                                     ssl_context=self.ssl_context)
        except smtp.NotSent as exc:
            if appended:
                await self._drop_journal(imap, message_id)
            raise NotPerformed(f"SMTP: {exc}") from exc
        except smtp.InDoubt as exc:
            # The server may have taken it: the flagged copy in Sent stays, and the
            # reconcile that comes before any retry takes it as sent.
            log.warning("email: the SMTP connection died during DATA of <%s>; it may have "
                        "gone out: %s", message_id, exc)
            raise Unavailable(f"SMTP connection lost during DATA, sent in doubt: {exc}") \
                from exc
        except (*CONNECTION_ERRORS, ImapError) as exc:  # journaling failed: DATA never began
            if appended:  # a copy left behind is only queued: `find` takes it as not sent
                with contextlib.suppress(*CONNECTION_ERRORS, ImapError, RuntimeError):
                    await self._drop_journal(imap, message_id)
            raise NotPerformed(f"IMAP journal in {sent} failed: {exc}") from exc
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
            await imap.set_flags(uid, f"{QUEUED} {SENDING}", add=False)

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
                copies = {uid: await imap.flags(uid)
                          for uid in await self._copies(imap, message_id)}
                queued = [u for u, flags in copies.items()
                          if QUEUED in flags and SENDING not in flags]
                if len(queued) == len(copies):
                    # Journaled, but DATA never began: not sent. The stale copies go, so
                    # the send that follows leaves exactly one.
                    for uid in queued:
                        await imap.delete(uid)
                    return None
                in_doubt = all(SENDING in flags for flags in copies.values())
                if in_doubt:
                    log.warning("email: message <%s> was being sent when it was cut off; "
                                "it is taken as sent and not repeated (its copy is in %s)",
                                message_id, self.config.sent_mailbox)
                for uid, flags in copies.items():
                    if uid in queued:
                        await imap.delete(uid)
                    elif flags & {QUEUED, SENDING}:
                        await imap.set_flags(uid, f"{QUEUED} {SENDING}", add=False)
        except (*CONNECTION_ERRORS, ImapError) as exc:
            raise Unavailable(f"IMAP unavailable to look for <{message_id}> in "
                              f"{self.config.sent_mailbox}: {exc}") from exc
        return {"message_id": message_id, "to": message.reply_to.get("to"),
                "found_in": self.config.sent_mailbox, "in_doubt": in_doubt}
