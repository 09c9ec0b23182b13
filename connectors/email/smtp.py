"""Sending one message over SMTP with aiosmtplib (`ssl`, `starttls` or `none`), around
two hooks. The envelope is accepted first (MAIL, RCPT), then `before_data()` runs (the
channel journals the reply in Sent there), then a NOOP checks the server is still there
(the hook takes a while), then DATA: the server's 354, the message's lines and the final
dot, written in one step with nothing awaited between them. Only once the dot is written
is `after_dot()` started (the channel marks its journal copy: the dot has gone), and it
runs while the server's answer is awaited; `send` returns or raises after both.

A server drops a transaction whose client went away before the final dot, so a crash
anywhere before the dot means not sent. From the dot to the server's answer the outcome
cannot be known (the server has the message, to take or to refuse); no hook runs before
the dot, so nothing recorded can claim the message went before it did. Failures say
whether the message may have gone out: `NotSent` (certainly not: nothing was accepted,
the connection was gone before the dot, or the server refused the data) or `InDoubt` (the
connection died after the dot, before the answer).

Kill points (kind `email`, bot/runtime/killpoints.py): `smtp-data` (DATA's 354 is in, no
line written), `smtp-before-dot` (every line written, the dot not), `smtp-dot` (the dot
written, `after_dot()` not started)."""

import asyncio
import re
import ssl
from collections.abc import Awaitable, Callable

import aiosmtplib
from aiosmtplib import SMTPStatus
from aiosmtplib.protocol import normalize_message_line_endings

from bot.runtime.killpoints import kill_point
from connectors.email.config import EmailConfig
from connectors.email.errors import InDoubt, NotSent

TIMEOUT = 60.0  # seconds per SMTP exchange
PERIOD = re.compile(rb"(?m)^\.")  # a line starting with "." is sent as ".." (RFC 5321)


async def send(config: EmailConfig, password: str | None, *, sender: str,
               recipients: list[str], data: bytes,
               before_data: Callable[[], Awaitable[None]],
               after_dot: Callable[[], Awaitable[None]] | None = None,
               ssl_context: ssl.SSLContext | None = None) -> str:
    """Send `data`; return the server's answer to DATA. `after_dot` must not raise for
    its own failures (they do not change whether the message went out)."""
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
        response = await _data(client, data, after_dot)
        return f"{response.code} {response.message}"
    finally:
        if client.is_connected:
            try:
                await client.quit()
            except (aiosmtplib.SMTPException, OSError, TimeoutError):
                client.close()


async def _data(client: aiosmtplib.SMTP, data: bytes,
                after_dot: Callable[[], Awaitable[None]] | None) -> aiosmtplib.SMTPResponse:
    """DATA, with `after_dot()` started once the dot that ends the lines is written.
    aiosmtplib's `SMTP.data` gives no hold between the dot and the answer, so the exchange
    is spelled out here on its protocol, as its own `execute_data_command` does."""
    try:
        start = await client.execute_command(b"DATA")
        if start.code != SMTPStatus.start_input:
            raise NotSent(f"the server refused DATA: {start.code} {start.message}")
        protocol = client.protocol
        assert protocol is not None
        kill_point("smtp-data", "email")
        body = PERIOD.sub(b"..", normalize_message_line_endings(data))
        if not body.endswith(b"\r\n"):
            body += b"\r\n"
        protocol.write(body)
        kill_point("smtp-before-dot", "email")
        protocol._response_pending = True  # the answer may come before we wait for it
        protocol.write(b".\r\n")  # raises if the connection is already known to be gone
    except NotSent:
        raise
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise NotSent(f"the connection was lost before the end of DATA: "
                      f"{type(exc).__name__}: {exc}") from exc
    kill_point("smtp-dot", "email")
    await _flushed(protocol)
    marking = asyncio.ensure_future(after_dot()) if after_dot is not None else None
    try:
        response = await protocol.read_response(timeout=TIMEOUT)
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise InDoubt(f"{type(exc).__name__}: {exc}") from exc
    finally:
        if marking is not None:
            await marking
    if response.code != SMTPStatus.completed:
        raise NotSent(f"the server refused the message: {response.code} {response.message}")
    return response


async def _flushed(protocol) -> None:
    """Wait until the kernel has every byte written, the dot included (a process killed
    after that still sends it: its socket is closed, not reset), so the mark that says the
    dot has gone is never stored while the dot waits in this process's buffer."""
    transport = protocol.transport
    deadline = asyncio.get_running_loop().time() + TIMEOUT
    while (transport is not None and not transport.is_closing()  # noqa: ASYNC110 - no event
           and transport.get_write_buffer_size()
           and asyncio.get_running_loop().time() < deadline):
        await asyncio.sleep(0.005)

