"""Watching the mailbox: connect, take every message past the cursor, then wait with IDLE
(re-issued every `idle_seconds`) or poll every `poll_seconds`; reconnect with backoff when
the connection or the server fails. Mail that arrived while Steward was stopped is simply
past the cursor, so it is taken on start.

The very first start takes the newest unread mail as its backlog (older mail is left alone);
a changed UIDVALIDITY takes again everything that arrived since shortly before the cursor
last moved: what was taken before is recognised by its Message-ID and not answered twice.

A message that fails on its own (the server refuses its FETCH, the store refuses what it
became, a bug) is tried again with a growing pause and quarantined with the reason once it
has failed `message_attempts` times over at least `message_quarantine_seconds`, then
passed, so it never blocks the mail after it, while a short outage, whatever it looks like,
never costs a message its place. Failures are told apart from an outage by looking: after
an error that is not a lost connection, the IMAP session and the store are probed, and if
either is down the error is the outage's (reconnect, retry, not counted against the
message). A refusal with an outage code (RFC 5530: UNAVAILABLE, INUSE, LIMIT, SERVERBUG:
the storage failing while NOOP still answers) is the outage's too, unless a later message
of the mailbox can be read: then it is this message's, as a message the server chokes on
every time would otherwise block the mailbox. A lost connection while a message is fetched
counts: a server that is down fails at connect or SELECT and never gets that far, while one
that drops the connection on the same message every time would otherwise block it too.
The count is kept in memory: messages are taken strictly in UID order and the first one
that fails stops the pass, so only one message can be failing at a time; a restart gives
it a fresh set of tries, which costs seconds, not mail.

The store's own outage (its database restarting, the disk under it full: the port's
`store_unavailable`) is never a message's fault, even when reads still work: the pass
stops, nothing is counted, and it is tried again every `store_retry_seconds` until the
store takes the message, logged once when it starts and once when it ends.
"""

import asyncio
import logging
import time
from datetime import UTC, datetime

from bot.port import store_unavailable
from connectors.email import cursor as cursors
from connectors.email.errors import MessageFailed, describe
from connectors.email.imap import CONNECTION_ERRORS, ImapError, ImapSession, Selected
from connectors.email.intake import Intake

log = logging.getLogger(__name__)

FIRST_BACKLOG = 50  # unread messages taken on the very first start
RESYNC_MARGIN = 2 * 86400.0  # seconds before the cursor's last move that a resync re-reads
RESYNC_BACKLOG = 5000
MAX_BACKOFF = 300.0


class _Failures:
    """How often the message the watcher is stuck on has failed: one (UIDVALIDITY, UID),
    since the first failure stops the pass."""

    def __init__(self):
        self.at: tuple[int, int] | None = None
        self.count = 0
        self.since = 0.0  # time.monotonic() of its first failure

    def note(self, uidvalidity: int, uid: int) -> int:
        if self.at != (uidvalidity, uid):
            self.at, self.count, self.since = (uidvalidity, uid), 0, time.monotonic()
        self.count += 1
        return self.count

    def failing_for(self) -> float:
        """Seconds since the message's first failure."""
        return time.monotonic() - self.since

    def clear(self) -> None:
        self.at, self.count, self.since = None, 0, 0.0


class Watcher:
    reconnect_seconds = 1.0  # first pause before reconnecting, doubled up to MAX_BACKOFF
    message_attempts = 5  # tries of a message that fails on its own before its quarantine
    message_quarantine_seconds = 120.0  # ... and how long at least it must have been failing
    message_retry_seconds = 1.0  # pause after its first failure, doubled after each
    probe_messages = 3  # later messages tried to tell an outage code from a message's fault
    store_retry_seconds = 2.0  # pause while the store is away (no growing backoff: it is
    # the store, not the mail server, that must be back, and mail waits meanwhile)

    def __init__(self, intake: Intake, open_session, *, mailbox: str, idle_seconds: float,
                 poll_seconds: float, max_message_bytes: int):
        self.intake = intake
        self.open_session = open_session  # () -> ImapSession (not yet opened)
        self.mailbox = mailbox
        self.idle_seconds = idle_seconds
        self.poll_seconds = poll_seconds
        self.max_message_bytes = max_message_bytes
        self.connected = asyncio.Event()  # set while a session is up (tests wait on it)
        self._failures = _Failures()
        self._store_down_since: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        backoff = self.reconnect_seconds
        while not stop.is_set():
            delay = None  # the reconnect backoff, unless a message failed
            try:
                async with self.open_session() as imap:
                    self.connected.set()
                    if backoff > self.reconnect_seconds:  # the answer to the warnings
                        log.warning("email: connected to %s", self.mailbox)
                    backoff = self.reconnect_seconds
                    await self._serve(imap, stop)
            except MessageFailed as exc:
                delay = min(MAX_BACKOFF,
                            self.message_retry_seconds * 2 ** (exc.attempts - 1))
                log.warning("email: message %d of %s failed (attempt %d, for %.0f s): %s; "
                            "trying it again in %.1f s", exc.uid, self.mailbox, exc.attempts,
                            self._failures.failing_for(), describe(exc.cause), delay,
                            exc_info=exc.cause if exc.attempts == 1 else None)
            except Exception as exc:
                if store_unavailable(exc):
                    delay = self.store_retry_seconds
                    if self._store_down_since is None:
                        self._store_down_since = time.monotonic()
                        log.warning("email: the store is unavailable (%s); taking mail again "
                                    "when it is back", describe(exc))
                elif isinstance(exc, (*CONNECTION_ERRORS, ImapError)):
                    log.warning("email: IMAP %s; reconnecting in %.0f s", describe(exc),
                                backoff)
                else:
                    log.exception("email: mailbox watcher failed; restarting in %.0f s",
                                  backoff)
            finally:
                self.connected.clear()
            if stop.is_set():
                return
            try:
                await asyncio.wait_for(stop.wait(), backoff if delay is None else delay)
            except TimeoutError:
                pass
            if delay is None:
                backoff = min(MAX_BACKOFF, backoff * 2)

    async def _serve(self, imap: ImapSession, stop: asyncio.Event) -> None:
        selected = await imap.select(self.mailbox)
        log.info("email: watching %s (%s)", self.mailbox,
                 "IDLE" if imap.can_idle else f"polling every {self.poll_seconds:g} s")
        while not stop.is_set():
            await self.sync(imap, selected, stop)
            if self._store_down_since is not None:
                log.warning("email: the store is back after %.0f s; mail is taken again",
                            time.monotonic() - self._store_down_since)
                self._store_down_since = None
            if stop.is_set():
                return
            await imap.wait_for_mail(self.idle_seconds if imap.can_idle else self.poll_seconds,
                                     stop)

    async def sync(self, imap: ImapSession, selected: Selected, stop: asyncio.Event) -> None:
        """Take every message the cursor has not passed yet, oldest first."""
        cursor = await self.intake.cursor(self.mailbox)
        if cursor is None or cursor.uidvalidity != selected.uidvalidity:
            cursor = await self._start_cursor(imap, selected, cursor)
        pending = list(cursor.backlog)
        pending += [u for u in await imap.search("UID", f"{cursor.uid + 1}:*") if u > cursor.uid]
        sizes = await imap.sizes(pending) if pending else {}
        for uid in pending:
            if stop.is_set():
                return
            cursor = await self._take(imap, cursor, uid, sizes.get(uid, 0))

    async def _take(self, imap: ImapSession, cursor: cursors.Cursor, uid: int,
                    size: int) -> cursors.Cursor:
        """Take one message; returns the cursor past it. A failure of this message is
        retried (`MessageFailed`) and, once it has failed `message_attempts` times,
        quarantined; an outage found by the probe is raised as it is."""
        raw: bytes | None = None
        fetching = False  # a lost connection while fetching counts against the message
        try:
            if size > self.max_message_bytes:
                _, cursor = await self.intake.unreadable(
                    cursor, uid, f"message of {size} bytes is larger than the "
                    f"{self.max_message_bytes}-byte limit")
            else:
                fetching = True
                raw = await imap.fetch(uid)
                no_body = raw is None and uid in await imap.search("UID", str(uid))
                fetching = False
                if no_body:
                    # There, but its body did not come back: say so, do not skip it silently.
                    _, cursor = await self.intake.unreadable(
                        cursor, uid, "the server returned no body for the message")
                else:
                    _, cursor = await self.intake.take(cursor, uid, raw)
        except Exception as exc:
            if store_unavailable(exc):
                raise  # the store's outage: waited out by `run`, not counted
            if not (fetching and isinstance(exc, CONNECTION_ERRORS)):
                await self._probe(imap)  # raises if the server or the store is down
            if (isinstance(exc, ImapError) and exc.outage
                    and not await self._others_readable(imap, uid)):
                raise  # the mailbox's trouble (its storage, a lock): waited out, not counted
            attempts = self._failures.note(cursor.uidvalidity, uid)
            if (attempts < self.message_attempts
                    or self._failures.failing_for() < self.message_quarantine_seconds):
                raise MessageFailed(uid, attempts, exc) from exc
            reason = (f"could not be taken in {attempts} attempts over "
                      f"{self._failures.failing_for():.0f} s: {describe(exc)}")
            log.error("email: message %d of %s %s; quarantining it", uid, self.mailbox, reason)
            cursor = await self._quarantine(cursor, uid, reason, raw)
        self._failures.clear()
        return cursor

    async def _probe(self, imap: ImapSession) -> None:
        """Raise if the IMAP session or the store does not answer."""
        await imap.noop()
        await self.intake.cursor(self.mailbox)

    async def _others_readable(self, imap: ImapSession, uid: int) -> bool:
        """Whether the server can read a later message (one of the first `probe_messages`
        after `uid`), i.e. refusing `uid` is that message's trouble. With no later message
        nothing waits behind it, so it is taken for an outage until mail arrives."""
        later = [u for u in await imap.search("UID", f"{uid + 1}:*") if u > uid]
        for other in later[:self.probe_messages]:
            try:
                await imap.peek(other)
            except ImapError as exc:
                log.info("email: message %d of %s cannot be read either: %s", other,
                         self.mailbox, describe(exc))
                continue
            return True
        return False

    async def _quarantine(self, cursor: cursors.Cursor, uid: int, reason: str,
                          raw: bytes | None) -> cursors.Cursor:
        if raw:
            try:
                return (await self.intake.unreadable(cursor, uid, reason, raw=raw))[1]
            except Exception:  # what the message became may be the trouble: record less
                log.exception("email: quarantining message %d with its head failed", uid)
        return (await self.intake.unreadable(cursor, uid, reason))[1]

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


