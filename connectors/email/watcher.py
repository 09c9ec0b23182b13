"""Watching the mailbox: connect, take every message past the cursor, then wait with IDLE
(re-issued every `idle_seconds`) or poll every `poll_seconds`; reconnect with backoff when
the connection or the server fails. Mail that arrived while Steward was stopped is simply
past the cursor, so it is taken on start.

The very first start takes the newest unread mail as its backlog (older mail is left alone);
a changed UIDVALIDITY takes again everything that arrived since shortly before the cursor
last moved: what was taken before is recognised by its Message-ID and not answered twice.
"""

import asyncio
import logging
import time
from datetime import UTC, datetime

from connectors.email import cursor as cursors
from connectors.email.imap import CONNECTION_ERRORS, ImapError, ImapSession, Selected
from connectors.email.intake import Intake

log = logging.getLogger(__name__)

FIRST_BACKLOG = 50  # unread messages taken on the very first start
RESYNC_MARGIN = 2 * 86400.0  # seconds before the cursor's last move that a resync re-reads
RESYNC_BACKLOG = 5000
MAX_BACKOFF = 300.0


class Watcher:
    def __init__(self, intake: Intake, open_session, *, mailbox: str, idle_seconds: float,
                 poll_seconds: float, max_message_bytes: int):
        self.intake = intake
        self.open_session = open_session  # () -> ImapSession (not yet opened)
        self.mailbox = mailbox
        self.idle_seconds = idle_seconds
        self.poll_seconds = poll_seconds
        self.max_message_bytes = max_message_bytes
        self.connected = asyncio.Event()  # set while a session is up (tests wait on it)

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 1.0
        while not stop.is_set():
            try:
                async with self.open_session() as imap:
                    self.connected.set()
                    backoff = 1.0
                    await self._serve(imap, stop)
            except (*CONNECTION_ERRORS, ImapError) as exc:
                log.warning("email: IMAP %s; reconnecting in %.0f s", _describe(exc), backoff)
            except Exception:
                log.exception("email: mailbox watcher failed; restarting in %.0f s", backoff)
            finally:
                self.connected.clear()
            if stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), backoff)
            except TimeoutError:
                pass
            backoff = min(MAX_BACKOFF, backoff * 2)

    async def _serve(self, imap: ImapSession, stop: asyncio.Event) -> None:
        selected = await imap.select(self.mailbox)
        log.info("email: watching %s (%s)", self.mailbox,
                 "IDLE" if imap.can_idle else f"polling every {self.poll_seconds:g} s")
        while not stop.is_set():
            await self.sync(imap, selected, stop)
            if stop.is_set():
                return
            await imap.wait_for_mail(self.idle_seconds if imap.can_idle else self.poll_seconds,
                                     stop)

    async def sync(self, imap: ImapSession, selected: Selected, stop: asyncio.Event) -> None:
        """Take every message the cursor has not passed yet, oldest first."""
        store, address = self.intake.store, self.intake.config.address
        cursor = await cursors.load(store, address, self.mailbox)
        if cursor is None or cursor.uidvalidity != selected.uidvalidity:
            cursor = await self._start_cursor(imap, selected, cursor)
        pending = list(cursor.backlog)
        pending += [u for u in await imap.search("UID", f"{cursor.uid + 1}:*") if u > cursor.uid]
        sizes = await imap.sizes(pending) if pending else {}
        for uid in pending:
            if stop.is_set():
                return
            size = sizes.get(uid, 0)
            if size > self.max_message_bytes:
                _, cursor = await self.intake.unreadable(
                    cursor, uid, f"message of {size} bytes is larger than the "
                    f"{self.max_message_bytes}-byte limit")
                continue
            raw = await imap.fetch(uid)
            if raw is None and uid in await imap.search("UID", str(uid)):
                # There, but its body did not come back: say so rather than skip it silently.
                _, cursor = await self.intake.unreadable(
                    cursor, uid, "the server returned no body for the message")
                continue
            _, cursor = await self.intake.take(cursor, uid, raw)

    async def _start_cursor(self, imap: ImapSession, selected: Selected,
                            old: cursors.Cursor | None) -> cursors.Cursor:
        """A cursor for a mailbox seen for the first time, or whose UIDVALIDITY changed."""
        top = max(selected.uidnext - 1, 0)
        if old is None:
            unread = await imap.search("UNSEEN")
            backlog = unread[-FIRST_BACKLOG:]
            if len(unread) > len(backlog):
                log.warning("email: first start: answering the %d newest unread messages, "
                            "leaving %d older ones alone", len(backlog),
                            len(unread) - len(backlog))
        else:
            since = datetime.fromtimestamp(max(old.at - RESYNC_MARGIN, 0), UTC)
            backlog = (await imap.search("SINCE", imap_date(since)))[-RESYNC_BACKLOG:]
            log.warning("email: UIDVALIDITY of %s changed (%d -> %d): re-reading %d messages "
                        "since %s by Message-ID", self.mailbox, old.uidvalidity,
                        selected.uidvalidity, len(backlog), since.date())
        top = max([top, *backlog])
        cursor = cursors.Cursor(selected.uidvalidity, top, tuple(u for u in backlog if u <= top),
                                time.time())
        await self.intake.commit_cursor(cursor)
        return cursor


MONTHS = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()


def imap_date(when: datetime) -> str:
    """An IMAP search date (RFC 3501 `date`), independent of the locale."""
    return f"{when.day}-{MONTHS[when.month - 1]}-{when.year}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
