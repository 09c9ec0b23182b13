"""Sending one message over SMTP with aiosmtplib (`ssl`, `starttls` or `none`), in two
steps around a hook: the envelope is accepted first, then `before_data()` runs (the channel
journals the reply in Sent there), then a NOOP checks the server is still there (the hook
takes a while), then DATA. Failures say whether the message may have gone out: `NotSent`
(certainly not: nothing was accepted, the connection was gone before DATA, or the server
refused the data) or `InDoubt` (the connection died while the server was taking the
data)."""

import ssl
from collections.abc import Awaitable, Callable

import aiosmtplib

from bot.config import EmailConfig

TIMEOUT = 60.0  # seconds per SMTP exchange


class NotSent(Exception):
    pass


class InDoubt(Exception):
    pass


async def send(config: EmailConfig, password: str | None, *, sender: str,
               recipients: list[str], data: bytes,
               before_data: Callable[[], Awaitable[None]],
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
        try:
            response = await client.data(data)
        except aiosmtplib.SMTPResponseException as exc:
            raise NotSent(f"the server refused the message: {exc.code} {exc.message}") from exc
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise InDoubt(f"{type(exc).__name__}: {exc}") from exc
        return f"{response.code} {response.message}"
    finally:
        if client.is_connected:
            try:
                await client.quit()
            except (aiosmtplib.SMTPException, OSError, TimeoutError):
                client.close()
