"""A narrow async IMAP seam over aioimaplib: connect (`ssl`, `starttls` or `none`) and log
in, select, search, fetch with `BODY.PEEK[]` (nothing is marked \\Seen), append, flags and
IDLE. Every server refusal is an `ImapError`; lost connections surface as `OSError`,
`TimeoutError` or aioimaplib's own errors (see `CONNECTION_ERRORS`)."""

import asyncio
import base64
import re
import ssl
from dataclasses import dataclass

from aioimaplib import aioimaplib

from connectors.email.errors import ImapError

CONNECTION_ERRORS = (OSError, TimeoutError, aioimaplib.AioImapException, EOFError)
EXISTS = re.compile(rb"^\* \d+ EXISTS")
FETCH_UID = re.compile(rb"UID (\d+)")
FETCH_SIZE = re.compile(rb"RFC822\.SIZE (\d+)")
FLAGS = re.compile(rb"FLAGS \(([^)]*)\)")


@dataclass(frozen=True)
class Selected:
    uidvalidity: int
    uidnext: int
    exists: int


def mailbox_name(name: str) -> str:
    """A mailbox name as an IMAP quoted string, non-ASCII in modified UTF-7 (RFC 3501)."""
    out, pending = [], []

    def flush():
        if pending:
            packed = base64.b64encode("".join(pending).encode("utf-16-be")).decode()
            out.append("&" + packed.rstrip("=").replace("/", ",") + "-")
            pending.clear()

    for ch in name:
        if 0x20 <= ord(ch) <= 0x7E:
            flush()
            out.append("&-" if ch == "&" else ch)
        else:
            pending.append(ch)
    flush()
    encoded = "".join(out).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{encoded}"'


class _Protocol(aioimaplib.IMAP4ClientProtocol):
    """Notes every untagged EXISTS, including those aioimaplib drops between commands, so
    mail that arrives just before IDLE starts is not left waiting for the next wake-up."""

    new_mail = False

    def _untagged_response(self, line: bytes):
        if EXISTS.match(line):
            self.new_mail = True
        return super()._untagged_response(line)


class _Client(aioimaplib.IMAP4):
    def create_client(self, host, port, loop, conn_lost_cb=None, ssl_context=None):
        local_loop = loop if loop is not None else asyncio.get_running_loop()
        self.protocol = _Protocol(local_loop, conn_lost_cb)
        self._client_task = local_loop.create_task(local_loop.create_connection(
            lambda: self.protocol, host, port, ssl=ssl_context))


def _check(response, what: str):
    if response.result != "OK":
        text = b" ".join(line for line in response.lines if isinstance(line, bytes))
        # The tagged answer (the last line) carries the response code: "[UNAVAILABLE] ...".
        last = response.lines[-1] if response.lines else b""
        found = re.match(rb"\s*\[([A-Za-z0-9-]+)", bytes(last)) if isinstance(
            last, (bytes, bytearray)) else None
        raise ImapError(f"{what}: {response.result} {text.decode('utf-8', 'replace')}",
                        found.group(1).decode() if found else None)
    return response


class ImapSession:
    def __init__(self, *, host: str, port: int, security: str, user: str, password: str,
                 ssl_context: ssl.SSLContext | None = None, timeout: float = 30.0):
        self.host, self.port, self.security = host, port, security
        self.user, self.password = user, password
        self.ssl_context = ssl_context
        self.timeout = timeout
        self.client: _Client | None = None

    async def __aenter__(self) -> "ImapSession":
        try:
            await self.open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _context(self) -> ssl.SSLContext:
        return self.ssl_context or ssl.create_default_context()

    async def open(self) -> None:
        tls = self._context() if self.security == "ssl" else None
        self.client = _Client(self.host, self.port, timeout=self.timeout, ssl_context=tls)
        await self.client.wait_hello_from_server()
        if self.security == "starttls":
            await self._starttls()
        _check(await self.client.login(self.user, self.password), "LOGIN")
        await asyncio.wait_for(self.client.protocol.capability(), self.timeout)

    async def _starttls(self) -> None:
        protocol = self.client.protocol
        if "STARTTLS" not in protocol.capabilities:
            raise ImapError("the server does not offer STARTTLS")
        _check(await asyncio.wait_for(protocol.execute(aioimaplib.Command(
            "STARTTLS", protocol.new_tag(), loop=protocol.loop)), self.timeout), "STARTTLS")
        loop = asyncio.get_running_loop()
        protocol.transport = await loop.start_tls(protocol.transport, protocol,
                                                  self._context(), server_hostname=self.host)
        await asyncio.wait_for(protocol.capability(), self.timeout)

    async def close(self) -> None:
        if self.client is None:
            return
        client, self.client = self.client, None
        transport = client.protocol.transport
        try:
            if client.get_state() in ("AUTH", "SELECTED", "NONAUTH"):
                await asyncio.wait_for(client.logout(), 5)
        except (*CONNECTION_ERRORS, ImapError):
            pass
        finally:
            if transport is not None:
                transport.close()
            if not client._client_task.done():
                client._client_task.cancel()

    # -- commands --------------------------------------------------------------------

    @property
    def can_idle(self) -> bool:
        return self.client.has_capability("IDLE")

    async def select(self, mailbox: str) -> Selected:
        response = _check(await self.client.select(mailbox_name(mailbox)), f"SELECT {mailbox}")
        text = b"\n".join(line for line in response.lines if isinstance(line, bytes))
        validity = re.search(rb"UIDVALIDITY (\d+)", text)
        uidnext = re.search(rb"UIDNEXT (\d+)", text)
        exists = re.search(rb"(\d+) EXISTS", text)
        if validity is None:
            raise ImapError(f"SELECT {mailbox}: no UIDVALIDITY in the answer")
        self.client.protocol.new_mail = False
        return Selected(int(validity.group(1)), int(uidnext.group(1)) if uidnext else 0,
                        int(exists.group(1)) if exists else 0)

    async def noop(self) -> None:
        _check(await self.client.noop(), "NOOP")

    async def exists(self, mailbox: str) -> bool:
        """Whether the mailbox exists (LIST finds it)."""
        name = mailbox_name(mailbox)
        response = _check(await self.client.list('""', name), "LIST")
        return any(isinstance(line, bytes) and line.startswith(b"(")
                   for line in response.lines[:-1])

    async def search(self, *criteria: str) -> list[int]:
        response = _check(await self.client.uid_search(*criteria, charset=None), "SEARCH")
        uids = []
        for line in response.lines[:-1]:
            if isinstance(line, bytes):
                uids.extend(int(t) for t in line.split() if t.isdigit())
        return sorted(set(uids))

    async def sizes(self, uids: list[int]) -> dict[int, int]:
        found: dict[int, int] = {}
        for start in range(0, len(uids), 200):
            chunk = ",".join(str(u) for u in uids[start:start + 200])
            response = _check(await self.client.uid("fetch", chunk, "(UID RFC822.SIZE)"),
                              "FETCH")
            for line in response.lines:
                if isinstance(line, bytes):
                    uid, size = FETCH_UID.search(line), FETCH_SIZE.search(line)
                    if uid and size:
                        found[int(uid.group(1))] = int(size.group(1))
        return found

    async def fetch(self, uid: int) -> bytes | None:
        """The whole message, read with BODY.PEEK[] so its flags stay as they are; None
        if it is gone."""
        response = _check(await self.client.uid("fetch", str(uid), "(UID BODY.PEEK[])"),
                          "FETCH")
        lines = response.lines
        for i, line in enumerate(lines):
            if isinstance(line, bytearray) and i > 0 and b"BODY[]" in bytes(lines[i - 1]):
                return bytes(line)
        return None

    async def peek(self, uid: int) -> None:
        """Read the first byte of a message's body (BODY.PEEK[]<0.1>): raises ImapError if
        the server cannot read it now."""
        _check(await self.client.uid("fetch", str(uid), "(UID BODY.PEEK[]<0.1>)"), "FETCH")

    async def flags(self, uid: int) -> set[str]:
        response = _check(await self.client.uid("fetch", str(uid), "(UID FLAGS)"), "FETCH")
        for line in response.lines:
            if isinstance(line, bytes) and (m := FLAGS.search(line)):
                return set(m.group(1).decode().split())
        return set()

    async def set_flags(self, uid: int, flags: str, *, add: bool) -> None:
        op = "+FLAGS.SILENT" if add else "-FLAGS.SILENT"
        # aioimaplib's UID STORE and UID EXPUNGE have no timeout of their own.
        _check(await asyncio.wait_for(self.client.uid("store", str(uid), op, f"({flags})"),
                                      self.timeout), "STORE")

    async def delete(self, uid: int) -> None:
        await self.set_flags(uid, "\\Deleted", add=True)
        if self.client.has_capability("UIDPLUS"):
            _check(await asyncio.wait_for(self.client.uid("expunge", str(uid)), self.timeout),
                   "EXPUNGE")
        else:
            _check(await self.client.expunge(), "EXPUNGE")

    async def append(self, mailbox: str, data: bytes, flags: str = "") -> None:
        """Append a message; the mailbox is created when the server says it is missing."""
        name = mailbox_name(mailbox)
        response = await self.client.append(data, mailbox=name, flags=flags or None)
        if response.result != "OK" and b"TRYCREATE" in b" ".join(
                line for line in response.lines if isinstance(line, bytes)):
            await self.client.create(name)
            response = await self.client.append(data, mailbox=name, flags=flags or None)
        _check(response, f"APPEND {mailbox}")

    async def wait_for_mail(self, seconds: float, stop: asyncio.Event) -> None:
        """Return when the server reports a change, `seconds` pass, or `stop` is set. Uses
        IDLE (re-issued by the caller each time) when the server offers it."""
        protocol = self.client.protocol
        if protocol.new_mail:  # announced during the last commands: look now
            protocol.new_mail = False
            return
        if not self.can_idle:
            try:
                await asyncio.wait_for(stop.wait(), seconds)
            except TimeoutError:
                pass
            return
        idle = await self.client.idle_start(timeout=seconds)
        waiters = [asyncio.ensure_future(self.client.wait_server_push(timeout=seconds + 30)),
                   asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            if self.client.has_pending_idle():
                self.client.idle_done()
            await asyncio.wait_for(idle, self.timeout)
            protocol.new_mail = False
