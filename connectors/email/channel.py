"""Email as a delivery channel: the answer goes out as a threaded reply, and Sent is the
journal that tells, after a crash, whether it already went.

    1. SMTP envelope accepted (MAIL, RCPT)          kill point `smtp-connected`
    2. the reply is appended to Sent, flagged `$StewardQueued`   kill point `smtp-journaled`
    3. NOOP (still there?); DATA's 354              kill point `smtp-data`;
       the message's lines                          kill point `smtp-before-dot`
    4. the final dot is written                     kill point `smtp-dot`;
       then, never before it, the copy is marked `$StewardSending` (one IMAP STORE, on its
       way while the server's answer is awaited)   kill point `smtp-marked`
    5. the server's answer, 250                     kill point `smtp-sent`
    6. the flags are removed: the Sent copy is final   kill point `sent-appended`

`find` (asked after a crash mid-send, or after a send in doubt) looks the Message-ID up in
Sent, and the mark decides:
- absent, or queued and not marked: the crash came before the mark. An SMTP server drops a
  transaction whose client went away before the final dot, so unless the crash fell just
  after the dot (below), nothing was sent: the copy is removed and the reply is sent now,
  under the same Message-ID, leaving one copy in Sent;
- marked: the dot was written; taken as sent, not repeated, and logged as in doubt;
- final (no Steward flag: a copy this channel finished, or the provider's own): sent.

The one window in doubt is the final dot and its answer, from the moment the dot is
written until both the server's answer is read and the mark is in Sent (the mark starts at
the dot and travels beside the server's handling of it). A crash in it:
- before the mark is in Sent (from the dot: one event-loop step and one IMAP round trip):
  the reply is sent again, with the same Message-ID (the delivery's idempotency key). If
  the server had taken the first, the recipient gets it twice under one Message-ID, which
  threads, and clients and archives that dedupe (Gmail, say), keep as one message. That
  duplicate is the accepted price: an unmarked copy cannot be told from a crash before
  the dot, where taking it as sent loses the reply (as it did when the flag was set a
  whole IMAP round trip before the dot).
- once the mark is in Sent, before the answer is read: taken as sent. The dot written
  before the crash still reaches the server (the kernel sends what was written), so this
  is wrong only if the server refused the message at the dot (an answer never read):
  then it is lost.
A crash anywhere before the dot: not sent, and sent (once). After the answer and the mark:
sent, never repeated. A copy marked by an older version (which marked it before the dot)
is read the same way.

How a send that fails without a crash ends, in the runtime's terms:
- certainly not sent (IMAP or SMTP unreachable, the envelope or the data refused, at the
  dot too, the SMTP connection gone before the dot): the journal copy, if any, is removed
  and `NotPerformed` is raised: tried again later;
- the connection died after the dot, before the answer (`smtp.InDoubt`): `Unavailable` is
  raised, so the delivery is reconciled before anything else: `find` takes the marked copy
  as sent in doubt, as after a crash, never twice; wrong (lost) only if the server refused
  it or the broken connection never carried the dot to it. A copy the mark did not reach
  (IMAP failing too) is sent again, as above;
- IMAP down while `find` looks: `Unavailable`, retried for the outage budget.
"""

import contextlib
import logging
import ssl
from typing import Any

from bot.port import Channel, NotPerformed, Outbound, Unavailable
from bot.runtime.killpoints import kill_point
from connectors.email import smtp
from connectors.email.config import EmailConfig
from connectors.email.imap import CONNECTION_ERRORS, ImapError, ImapSession
from connectors.email.reply import ANSWERS, build_reply, reply_message_id, sent_search

log = logging.getLogger(__name__)

QUEUED = "$StewardQueued"  # journaled, not known to be sent: sent again after a crash
SENDING = "$StewardSending"  # the final dot was written: taken as sent after a crash


class EmailChannel(Channel):
    name = "email"
    reaches_addresses = True

    def __init__(self, config: EmailConfig, *, open_session, smtp_password: str | None,
                 sender_name: str, ssl_context: ssl.SSLContext | None = None):
        self.config = config
        self.circle = tuple(config.allowed_senders)  # bot.tools.permissions: may be mailed
        self.open_session = open_session  # () -> ImapSession (not yet opened)
        self.smtp_password = smtp_password
        self.sender_name = sender_name
        self.ssl_context = ssl_context

    def asker_address(self, who: str | None) -> str | None:
        """A mail's author is known by address: the one it came from."""
        return who

    def how_to_approve(self, code: str) -> str:
        return f"Reply to this mail with YES {code} to approve, or NO {code} to refuse"

    def address_of(self, address: str, *, subject: str) -> dict[str, Any]:
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
        marked = False

        async def journal():
            nonlocal appended
            kill_point("smtp-connected", "email")
            await imap.append(sent, data, f"\\Seen {QUEUED}")
            appended = True
            journaled[:] = await self._copies(imap, message_id)
            kill_point("smtp-journaled", "email")

        async def mark():  # started once the final dot is written, never before it
            nonlocal marked
            try:
                for uid in journaled:
                    await imap.set_flags(uid, SENDING, add=True)
            except (*CONNECTION_ERRORS, ImapError) as exc:
                log.warning("email: the final dot of <%s> is written, but its Sent copy "
                            "could not be marked: %s", message_id, exc)
                return
            marked = bool(journaled)
            kill_point("smtp-marked", "email")

        try:
            answer = await smtp.send(self.config, self.smtp_password,
                                     sender=self.config.address, recipients=[recipient],
                                     data=data, before_data=journal, after_dot=mark,
                                     ssl_context=self.ssl_context)
        except smtp.NotSent as exc:
            if appended:
                await self._drop_journal(imap, message_id)
            raise NotPerformed(f"SMTP: {exc}") from exc
        except smtp.InDoubt as exc:
            # The server may have taken it. The reconcile that comes before any retry
            # takes the marked copy as sent; a copy the mark did not reach, it sends again.
            log.warning("email: the SMTP connection died after the final dot of <%s>, "
                        "before the answer; it may have gone out (%s): %s", message_id,
                        "taken as sent" if marked else "its copy is not marked: it will "
                        "be sent again under the same Message-ID", exc)
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
        except (*CONNECTION_ERRORS, ImapError):
            try:  # once more, on a connection of its own
                async with self.open_session() as again:
                    await self._finalise(again, message_id)
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
        return await imap.search("HEADER", "Message-ID", f'"{sent_search(message_id)}"')

    async def answered(self, message_id: str) -> bool:
        """Whether Sent holds a reply to the mail `message_id` (In-Reply-To, or among the
        mails a reply says it answers): one a home before a restore sent, say."""
        try:
            async with self.open_session() as imap:
                try:
                    await imap.select(self.config.sent_mailbox)
                except ImapError:
                    if not await imap.exists(self.config.sent_mailbox):
                        return False
                    raise
                quoted = f'"<{message_id}>"'
                return bool(await imap.search("OR", "HEADER", "In-Reply-To", quoted,
                                              "HEADER", ANSWERS, quoted))
        except (*CONNECTION_ERRORS, ImapError) as exc:
            raise Unavailable(f"IMAP unavailable to look for a reply to <{message_id}> in "
                              f"{self.config.sent_mailbox}: {exc}") from exc

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
                unmarked = [u for u, flags in copies.items()
                            if QUEUED in flags and SENDING not in flags]
                if len(unmarked) == len(copies):
                    if unmarked:
                        log.warning(
                            "email: reply <%s> was cut off before its Sent copy was marked "
                            "as sent: not sent (cut off before the final dot) or, cut off "
                            "just after the dot, sent; it is sent again under the same "
                            "Message-ID", message_id)
                    # The stale copies go, so the send that follows leaves exactly one.
                    for uid in unmarked:
                        await imap.delete(uid)
                    return None
                in_doubt = all(flags & {QUEUED, SENDING} for flags in copies.values())
                if in_doubt:
                    log.warning("email: message <%s> was being sent when it was cut off; "
                                "it is taken as sent and not repeated (its copy is in %s)",
                                message_id, self.config.sent_mailbox)
                for uid, flags in copies.items():
                    if uid in unmarked:
                        await imap.delete(uid)
                    elif flags & {QUEUED, SENDING}:
                        await imap.set_flags(uid, f"{QUEUED} {SENDING}", add=False)
        except (*CONNECTION_ERRORS, ImapError) as exc:
            raise Unavailable(f"IMAP unavailable to look for <{message_id}> in "
                              f"{self.config.sent_mailbox}: {exc}") from exc
        return {"message_id": message_id, "to": message.reply_to.get("to"),
                "found_in": self.config.sent_mailbox, "in_doubt": in_doubt}
