"""Sending one message over SMTP with aiosmtplib (`ssl`, `starttls` or `none`), around
hooks: the envelope is accepted first, then `before_data()` runs (the channel journals the
reply in Sent there), then a NOOP checks the server is still there (the hook takes a
while), then DATA: the server's 354, the message's lines, and only then `at_data()` (the
journal copy is marked as being sent) and the final dot. A server drops a transaction
whose client went away before that dot, so a crash anywhere before it means not sent;
the one window in doubt is from the dot to the server's answer, and in it the server has
the message. Failures say whether the message may have gone out: `NotSent` (certainly
not: nothing was accepted, the connection was gone before the dot, or the server refused
the data) or `InDoubt` (the connection died after the dot, before the answer)."""

import re
import ssl
from collections.abc import Awaitable, Callable

import aiosmtplib
from aiosmtplib import SMTPStatus
from aiosmtplib.protocol import normalize_message_line_endings

from connectors.email.config import EmailConfig
from connectors.email.errors import InDoubt, NotSent

TIMEOUT = 60.0  # seconds per SMTP exchange
PERIOD = re.compile(rb"(?m)^\.")  # a line starting with "." is sent as ".." (RFC 5321)


async def send(config: EmailConfig, password: str | None, *, sender: str,
               recipients: list[str], data: bytes,
               before_data: Callable[[], Awaitable[None]],
               at_data: Callable[[], Awaitable[None]] | None = None,
               ssl_context: ssl.SSLContext | None = None) -> str:
    """Send `data`; return the server's answer to DATA."""
    security = config.smtp_security
    client = aiosmtplib.SMTP(
        hostname=config.smtp_host, port=config.smtp_port, use_tls=security == "ssl",
        start_tls=security == "starttls", tls_context=ssl_context, timeout=TIMEOUT)
    try:
        try:
            await client.connect()
            if config.smtp_user:
                await client.login(config.smtp_user, password or "")
            await client.mail(sender)
            for recipient in recipients:
                await client.rcpt(recipient)
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise NotSent(f"{type(exc).__name__}: {exc}") from exc
        await before_data()
        try:
            await client.noop()
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise NotSent(f"the connection was lost before DATA: {type(exc).__name__}: "
                          f"{exc}") from exc
        response = await _data(client, data, at_data)
        return f"{response.code} {response.message}"
    finally:
        if client.is_connected:
            try:
                await client.quit()
            except (aiosmtplib.SMTPException, OSError, TimeoutError):
                client.close()


async def _data(client: aiosmtplib.SMTP, data: bytes,
                at_dot: Callable[[], Awaitable[None]] | None) -> aiosmtplib.SMTPResponse:
    """DATA, with `at_dot()` between the message's lines and the dot that ends them.
    aiosmtplib sends lines and dot in one write (`SMTP.data`), so the exchange is spelled
    out here on its protocol, as its own `execute_data_command` does."""
    try:
        start = await client.execute_command(b"DATA")
        if start.code != SMTPStatus.start_input:
            raise NotSent(f"the server refused DATA: {start.code} {start.message}")
        protocol = client.protocol
        assert protocol is not None
        body = PERIOD.sub(b"..", normalize_message_line_endings(data))
        if not body.endswith(b"\r\n"):
            body += b"\r\n"
        protocol.write(body)
        if at_dot is not None:
            try:
                await at_dot()
            except BaseException:
                client.close()  # no dot was sent: the server drops the transaction
                raise
        protocol._response_pending = True  # the answer may come before we wait for it
        protocol.write(b".\r\n")
    except NotSent:
        raise
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise NotSent(f"the connection was lost before the end of DATA: "
                      f"{type(exc).__name__}: {exc}") from exc
    try:
        response = await protocol.read_response(timeout=TIMEOUT)
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise InDoubt(f"{type(exc).__name__}: {exc}") from exc
    if response.code != SMTPStatus.completed:
        raise NotSent(f"the server refused the message: {response.code} {response.message}")
    return response
