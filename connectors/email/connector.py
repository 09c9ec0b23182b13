"""The email connector: a mailbox watcher feeding the agent, and the channel its answers
go out through. Built by the composition root as `EmailConnector(section, host)`."""

import asyncio
import logging
import ssl

from bot.port import Connector, Host
from connectors.email.channel import EmailChannel
from connectors.email.config import EmailConfig
from connectors.email.imap import ImapSession
from connectors.email.intake import Intake
from connectors.email.watcher import Watcher

log = logging.getLogger(__name__)

STOP_SECONDS = 15.0
FIRST_CONNECT_SECONDS = 2.0  # start() waits this long to say whether the mailbox is up
MIN_MESSAGE_LIMIT = 25_000_000  # bytes; bigger mail is quarantined unread


def message_limit(max_attachment_bytes: int) -> int:
    """The largest message fetched: room for a few attachments at the cap, base64-encoded."""
    return max(MIN_MESSAGE_LIMIT, 4 * max_attachment_bytes + 1_000_000)


class EmailConnector(Connector):
    name = "email"

    def __init__(self, config: EmailConfig, host: Host, *,
                 ssl_context: ssl.SSLContext | None = None,
                 max_message_bytes: int | None = None):
        email = config  # the [email] section
        port = host.port
        password = host.secret(email.imap_password_env)
        smtp_password = host.secret(email.smtp_password_env) if email.smtp_user else None

        def open_session() -> ImapSession:
            return ImapSession(host=email.imap_host, port=email.imap_port,
                               security=email.imap_security,
                               user=email.imap_user or email.address, password=password,
                               ssl_context=ssl_context)

        self.config = email
        self.channel = EmailChannel(email, open_session=open_session,
                                    smtp_password=smtp_password, sender_name=host.agent_name,
                                    ssl_context=ssl_context)
        self.intake = Intake(port, email, answered=self.channel.answered)
        self.watcher = Watcher(
            self.intake, open_session, mailbox=email.mailbox, idle_seconds=email.idle_seconds,
            poll_seconds=email.poll_seconds,
            max_message_bytes=max_message_bytes or message_limit(email.max_attachment_bytes))
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        # Several workers on one store: one watches the mailbox; another takes over when it
        # dies (store/leader.py). Sending answers works on every worker.
        self.leader = port.leader(f"email:{email.address}") if port.shared else None

    @property
    def up(self) -> bool:
        """Whether an IMAP session is open now (`steward run` says so at start)."""
        return self.watcher.connected.is_set()

    async def start(self) -> None:
        """Begin watching the mailbox; a server that cannot be reached is asked again with
        backoff, for ever (a home server may boot before its network)."""
        self._stop.clear()
        watching = self.watcher.run(self._stop) if self.leader is None else self._lead()
        self._task = asyncio.create_task(watching, name="email-watcher")
        try:
            await asyncio.wait_for(self.watcher.connected.wait(), FIRST_CONNECT_SECONDS)
        except TimeoutError:
            pass
        log.info("email: connector started for %s", self.config.address)

    async def _lead(self) -> None:
        """Watch while this worker leads; when the lead is lost, stop and wait for it."""
        assert self.leader is not None
        try:
            while await self.leader.acquire(self._stop):
                stop = asyncio.Event()  # set by whichever comes first
                waits = [asyncio.ensure_future(e.wait()) for e in (self._stop, self.leader.lost)]
                for wait in waits:
                    wait.add_done_callback(lambda _, stop=stop: stop.set())
                try:
                    await self.watcher.run(stop)
                finally:
                    for wait in waits:
                        wait.cancel()
                if self._stop.is_set():
                    return
                log.warning("email: no longer the worker watching %s", self.config.address)
        finally:
            await self.leader.release()

    async def stop(self) -> None:
        """Stop taking mail; a message being committed finishes first."""
        self._stop.set()
        if self._task is None:
            return
        task, self._task = self._task, None
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_SECONDS)
        except TimeoutError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
