"""Steward's email connector in-process for tests: the real wiring (`bot.app.wiring.wire`)
with a real store, a scripted model and the connector (its TLS and size options the
test's) pointed at a `Dovecot` and an `SmtpSink`. And
`mail(...)`, a builder for the messages people send."""

from __future__ import annotations

import asyncio
import contextlib
from email.utils import formatdate

import httpx
import pytest

from bot.app.config import build_config
from bot.app.wiring import wire
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Request, Response
from bot.runtime import RunnerOptions
from bot.tools import ToolBox
from connectors.email import cursor as cursors
from connectors.email.connector import EmailConnector
from tests.fakes.mail_servers import Account, SmtpSink

ADDRESS = "steward@example.com"
ALLOWED = "ann@example.com"
OPTIONS = RunnerOptions(concurrency=4, lease_seconds=5, retry_base_seconds=0.01,
                        retry_max_seconds=0.05, poll_seconds=0.05)


def email_toml(account: Account, sink: SmtpSink) -> str:
    """The `[email]` section of a `steward` subprocess's config.toml for Dovecot's `account`
    and the SMTP `sink`, with ALLOWED as the one allowed sender."""
    return f"""[email]
enabled = true
address = "{ADDRESS}"
imap_host = "127.0.0.1"
imap_port = {account.port}
imap_security = "none"
imap_user = "{account.user}"
smtp_host = "127.0.0.1"
smtp_port = {sink.port}
smtp_security = "none"
allowed_senders = ["{ALLOWED}"]
idle_seconds = 60.0
"""


def mail(*, sender: str = ALLOWED, subject: str = "A task", body: str = "Please do it.",
         message_id: str | None = None, in_reply_to: str | None = None,
         references: list[str] | None = None, to: str = ADDRESS,
         headers: dict[str, str] | None = None) -> bytes:
    lines = [f"From: {sender}", f"To: {to}", f"Subject: {subject}",
             f"Date: {formatdate(usegmt=True)}"]
    if message_id:
        lines.append(f"Message-ID: <{message_id}>")
    if in_reply_to:
        lines.append(f"In-Reply-To: <{in_reply_to}>")
    if references:
        lines.append("References: " + " ".join(f"<{r}>" for r in references))
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    lines += ["MIME-Version: 1.0", "Content-Type: text/plain; charset=utf-8",
              "Content-Transfer-Encoding: 8bit", "", body, ""]
    return "\r\n".join(lines).encode()


def answer(request: Request) -> Response:
    """The model: echoes the subject line of the message it answers."""
    last = next(m for m in reversed(request.messages) if m.role == "user")
    return Response(text=f"Answer to [{last.content.splitlines()[0]}]")


async def stored_cursor(store, address: str, mailbox: str = "INBOX") -> cursors.Cursor | None:
    """The mailbox cursor as the store holds it."""
    doc = await store.read_document(cursors.namespace(address), cursors.document_name(mailbox))
    return cursors.Cursor.from_json(doc.value)


class Rig:
    def __init__(self, store, account: Account, sink: SmtpSink, home, *,
                 connector: dict | None = None, **email):
        settings = {
            "enabled": True, "address": ADDRESS, "imap_host": "127.0.0.1",
            "imap_port": account.port, "imap_security": "none", "imap_user": account.user,
            "smtp_host": "127.0.0.1", "smtp_port": sink.port, "smtp_security": "none",
            "allowed_senders": [ALLOWED], "idle_seconds": 60.0, "poll_seconds": 60.0}
        settings.update(email)
        self.store = store
        self.config = build_config(
            {"email": settings, "runtime": {"retry_base_seconds": 0.01,
                                            "retry_max_seconds": 0.05}},
            home=home, env={"STEWARD_IMAP_PASSWORD": account.password})
        self.model = ScriptedModel(answer)
        self.http = httpx.AsyncClient()
        section = self.config.email
        self.app = wire(self.config, store, self.model, self.http, toolbox=ToolBox(),
                        options=OPTIONS, connectors=[
                            lambda host: EmailConnector(section, host, **(connector or {}))])
        self.deps, self.runner = self.app.deps, self.app.runner
        [self.connector] = self.app.connectors
        self._serving: asyncio.Task | None = None

    async def start(self, *, connected: bool = True, watch: bool = True) -> Rig:
        """Start the runner and (unless `watch` is False: only the channel then) the
        connector's mailbox watcher."""
        await self.runner.recover(steal_all=True)
        self._serving = asyncio.create_task(self.runner.run())
        if not watch:
            return self
        await self.connector.start()
        if connected:
            await asyncio.wait_for(self.connector.watcher.connected.wait(), 10)
        return self

    async def stop(self) -> None:
        await self.connector.stop()
        await self.runner.drain(5)
        if self._serving is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving
        await self.http.aclose()

    async def settle(self, seconds: float = 0.5) -> None:
        """Let anything still in flight arrive (to see that nothing more does)."""
        await asyncio.sleep(seconds)

    async def transcript(self, key: str):
        conversation = await self.store.get_conversation(key)
        return await self.store.entries_page(conversation.id, limit=200)


@contextlib.asynccontextmanager
async def rig_factory(store, account: Account, sink: SmtpSink, tmp_path):
    """`make(**email) -> Rig` for a test's fixture; every rig made is stopped at the end."""
    made: list[Rig] = []

    def make(**email) -> Rig:
        made.append(Rig(store, account, sink, tmp_path, **email))
        return made[-1]

    try:
        yield make
    finally:
        for rig in made:
            await rig.stop()


@pytest.fixture(name="rigs")
async def rigs_fixture(store, account, sink, tmp_path):
    """`rigs(**email) -> Rig` for a test (import it as a fixture); all stopped at its end."""
    async with rig_factory(store, account, sink, tmp_path) as make:
        yield make
