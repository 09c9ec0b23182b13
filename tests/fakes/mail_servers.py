"""Real mail servers for the email tests, on loopback ports of their own.

`Dovecot`: the real Dovecot IMAP server (Debian package dovecot-imapd; `bash
scripts/install-test-deps`) run in the foreground with a temporary config, a passwd-file
user and a temporary maildir, IDLE on (or off, to test polling). Its login processes refuse
to run as root, so under root they run as Dovecot's own unprivileged users (`dovecot`,
`dovenull`) and the mail belongs to `nobody`; under any other user everything runs as that
user. Helpers use the stdlib `imaplib` (in a thread), not the code under test.

Fixtures (import the `*_fixture` names into a test module): `dovecot`, one server for the
session; `account`, a fresh user on it; `sink`, an SmtpSink.

`SmtpSink`: a real aiosmtpd SMTP server on port 0 in the test's event loop that captures
every message it is given; plain, STARTTLS or implicit TLS. Both servers use the
self-signed certificate in `mail_tls` (Dovecot: STARTTLS on `port`, imaps on `tls_port`).
"""

from __future__ import annotations

import asyncio
import email
import getpass
import imaplib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import pytest
from aiosmtpd.smtp import SMTP as SMTPServer

from tests.fakes.mail_tls import server_context, write_pair

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"
ACCOUNTS = 500

CONFIG = """
base_dir = {root}/run
state_dir = {root}/state
log_path = {root}/dovecot.log
protocols = imap
listen = 127.0.0.1
ssl = yes
ssl_cert = <{root}/cert.pem
ssl_key = <{root}/key.pem
disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = {internal_user}
default_internal_group = {internal_group}
default_login_user = {login_user}
mail_location = maildir:~/Maildir
mail_uid = {uid}
mail_gid = {gid}
first_valid_uid = 1
first_valid_gid = 1
mailbox_idle_check_interval = 1 secs
{capability}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {root}/passwd
}}
userdb {{
  driver = passwd-file
  args = username_format=%u {root}/passwd
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    address = 127.0.0.1
    port = {tls_port}
    ssl = yes
  }}
}}
service pop3-login {{
  inet_listener pop3 {{
    port = 0
  }}
}}
service submission-login {{
  inet_listener submission {{
    port = 0
  }}
}}
namespace inbox {{
  inbox = yes
  separator = /
  mailbox Sent {{
    auto = create
    special_use = \\Sent
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Dovecot:
    """One server; `account()` adds a user with an empty maildir (the passwd file is
    re-read by Dovecot when it changes), so tests can share a server and stay apart."""

    def __init__(self, *, idle: bool = True):
        self.idle = idle
        self.port = 0  # plain, STARTTLS offered
        self.tls_port = 0  # implicit TLS (imaps)
        self.root: Path | None = None
        self.process: subprocess.Popen | None = None
        self._accounts = 0

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> Dovecot:
        self.root = Path(tempfile.mkdtemp(prefix="stw-dc-", dir="/tmp"))
        self.root.chmod(0o755)  # the unprivileged login and mail processes look inside
        mail = self.root / "mail"
        mail.mkdir()
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            uid, gid = nobody.pw_uid, nobody.pw_gid
            os.chown(mail, uid, gid)
            internal, internal_group, login = "dovecot", "dovecot", "dovenull"
        else:
            uid, gid = os.getuid(), os.getgid()
            internal = login = getpass.getuser()
            internal_group = str(gid)
        # All users up front: Dovecot may not notice a passwd file changed in the same second.
        (self.root / "passwd").write_text("".join(
            f"user{n}@example.com:{{PLAIN}}{Account.password}:{uid}:{gid}::"
            f"{mail}/user{n}@example.com::\n" for n in range(1, ACCOUNTS + 1)))
        (self.root / "passwd").chmod(0o644)  # read by Dovecot's auth user, whatever the umask
        self.port, self.tls_port = free_port(), free_port()
        write_pair(self.root)
        capability = "" if self.idle else "imap_capability = IMAP4rev1 LITERAL+ UIDPLUS"
        (self.root / "dovecot.conf").write_text(CONFIG.format(
            root=self.root, internal_user=internal, internal_group=internal_group,
            login_user=login, uid=uid, gid=gid, port=self.port, tls_port=self.tls_port,
            capability=capability))
        self.process = subprocess.Popen(
            [DOVECOT, "-F", "-c", str(self.root / "dovecot.conf")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60  # a loaded machine starts it slowly
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dovecot exited: {self.process.stderr.read().decode()} "
                                   f"{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    if s.recv(100).startswith(b"* OK"):
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"dovecot did not come up on port {self.port}: {self.log()}")

    def log(self) -> str:
        path = self.root / "dovecot.log" if self.root else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process.stderr.close()
            self.process = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def __enter__(self) -> Dovecot:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def account(self) -> Account:
        """A user of its own with an empty mailbox (INBOX and Sent)."""
        self._accounts += 1
        if self._accounts > ACCOUNTS:
            raise RuntimeError(f"this Dovecot has only {ACCOUNTS} test accounts")
        return Account(self, f"user{self._accounts}@example.com")


class Account:
    """One IMAP user. Helpers use the stdlib imaplib in a thread: independent of the code
    under test."""

    password = "dovecot-test-password"

    def __init__(self, server: Dovecot, user: str):
        self.server = server
        self.user = user

    @property
    def port(self) -> int:
        return self.server.port

    def _client(self) -> imaplib.IMAP4:
        client = imaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        client.login(self.user, self.password)
        return client

    def _call(self, fn):
        client = self._client()
        try:
            return fn(client)
        finally:
            client.logout()

    async def append(self, raw: bytes | str, mailbox: str = "INBOX", flags: str = "") -> int:
        """Put a message in a mailbox (as delivery would); returns its UID."""
        data = raw.encode() if isinstance(raw, str) else raw

        def work(c):
            typ, answer = c.append(mailbox, f"({flags})" if flags else None, None, data)
            assert typ == "OK", answer
            return int(answer[0].split()[2].rstrip(b"]"))
        return await asyncio.to_thread(self._call, work)

    async def flags(self, mailbox: str = "INBOX") -> dict[int, set[str]]:
        def work(c):
            c.select(mailbox, readonly=True)
            typ, data = c.uid("FETCH", "1:*", "(UID FLAGS)")
            found = {}
            for line in data:
                if not line:
                    continue
                text = line.decode()
                uid = int(text.split("UID ")[1].split()[0].rstrip(")"))
                found[uid] = set(text.split("FLAGS (")[1].split(")")[0].split())
            return found
        return await asyncio.to_thread(self._call, work)

    async def messages(self, mailbox: str = "INBOX") -> list[Message]:
        def work(c):
            typ, _ = c.select(mailbox, readonly=True)
            if typ != "OK":
                return []
            typ, data = c.uid("FETCH", "1:*", "(BODY.PEEK[])")
            return [email.message_from_bytes(part[1]) for part in data
                    if isinstance(part, tuple)]
        return await asyncio.to_thread(self._call, work)

    async def uidvalidity(self, mailbox: str = "INBOX") -> int:
        def work(c):
            c.select(mailbox, readonly=True)
            return int(c.response("UIDVALIDITY")[1][0])
        return await asyncio.to_thread(self._call, work)

    async def recreate(self, mailbox: str) -> None:
        """Delete and create a mailbox again: its UIDVALIDITY changes, its mail is gone."""
        def work(c):
            c.delete(mailbox)
            typ, answer = c.create(mailbox)
            assert typ == "OK", answer
        await asyncio.to_thread(self._call, work)

    async def create(self, mailbox: str) -> None:
        await asyncio.to_thread(self._call, lambda c: c.create(mailbox))


@dataclass
class Captured:
    mail_from: str
    rcpt_tos: list[str]
    data: bytes

    @property
    def message(self) -> Message:
        return email.message_from_bytes(self.data)


class SmtpSink:
    """aiosmtpd on 127.0.0.1, port 0, capturing messages in `.messages`."""

    server_class = SMTPServer  # one per connection; a subclass may watch the exchange

    def __init__(self, *, tls: str = "none"):
        self.tls = tls  # "none", "starttls" (offered and required) or "ssl" (implicit)
        self.messages: list[Captured] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._changed = asyncio.Event()

    async def start(self) -> SmtpSink:
        loop = asyncio.get_running_loop()
        starttls = server_context() if self.tls == "starttls" else None
        self._server = await loop.create_server(
            lambda: self.server_class(self, hostname="sink.test", loop=loop,
                                      tls_context=starttls,
                                      require_starttls=starttls is not None),
            "127.0.0.1", 0, ssl=server_context() if self.tls == "ssl" else None)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 - aiosmtpd
        self.messages.append(Captured(envelope.mail_from, list(envelope.rcpt_tos),
                                      envelope.original_content or envelope.content))
        self._changed.set()
        return "250 2.0.0 Ok: captured"

    async def wait_for(self, count: int, seconds: float = 60.0) -> list[Captured]:
        async def reach():
            while len(self.messages) < count:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(reach(), seconds)
        return self.messages

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


@pytest.fixture(scope="session", name="dovecot")
def dovecot_fixture():
    with Dovecot() as server:
        yield server


@pytest.fixture(name="account")
def account_fixture(dovecot) -> Account:
    return dovecot.account()


@pytest.fixture(name="sink")
async def sink_fixture():
    server = await SmtpSink().start()
    yield server
    await server.stop()
