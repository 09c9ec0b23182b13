"""The inspector's HTTP server (aiohttp): GET routes only, a guard in front of them, and
the same security headers on every response, errors included.

The guard: every request must carry the token, on loopback too (another user of the
machine can reach 127.0.0.1 as well), as `?token=` (the printed link; answered with a
cookie and a redirect that drops it from the address bar), the cookie, or
`Authorization: Bearer`; compared in constant time. The cookie is HttpOnly and
SameSite=Strict, and named after the port, since a browser keeps one jar per host for all
its ports. Bound to loopback, the Host header must also name a loopback host, so a web
page in the owner's browser cannot read the inspector through DNS rebinding.
"""

import asyncio
import hmac
import ipaddress
import logging
import re
import secrets
import signal

from aiohttp import web

from bot.app.errors import UsageError
from bot.app.inspector.html import tag
from bot.app.inspector.pages import ROUTES
from bot.app.inspector.pages.layout import SOURCE, page
from bot.app.inspector.source import Source, open_source
from bot.app.inspector.style import CSS
from bot.config import Config
from store import NotFound, StoreError

log = logging.getLogger(__name__)

COOKIE = "steward_inspector"  # and the port: `steward_inspector_8377`
MIN_TOKEN = 16  # characters of a given token; a made-up one has 32 (24 random bytes)
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~-]+")  # what a link and a cookie carry as is
HEADERS = {
    # No script at all; styles only from /style.css; the chart is inline SVG.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' data:; "
                               "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a link out must not carry a ?token= away
    "Cache-Control": "no-store",  # transcripts are private: no copies on disk
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
LOOPBACK_NAMES = {"localhost", "localhost."}


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(header: str) -> str:
    """The host part of a Host header (`[::1]:8080` -> `::1`, `a:80` -> `a`)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def _same(given: str | None, token: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def check_token(token: str) -> str:
    """A token given to `steward web` (`--token`, $STEWARD_WEB_TOKEN), if it is strong
    enough to guard every transcript; else a UsageError saying why."""
    if len(token) < MIN_TOKEN:
        raise UsageError(f"the inspector's token must be at least {MIN_TOKEN} characters, "
                         f"not {len(token)} (leave --token out and a random one is made "
                         "for each start)")
    if not _TOKEN_CHARS.fullmatch(token):
        raise UsageError("the inspector's token may hold only letters, digits and - _ . ~ "
                         "(it goes into a link and a cookie as it is)")
    return token


def _cookie(request: web.Request) -> str:
    """The cookie's name for the port this request came in on."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    port = sockname[1] if isinstance(sockname, tuple) else request.url.port
    return f"{COOKIE}_{port}"


def _guard(token: str, loopback: bool):
    @web.middleware
    async def guard(request: web.Request, handler):
        if loopback and not is_loopback(_host_of(request.host)):
            raise web.HTTPMisdirectedRequest(text="this inspector answers only to a "
                                                  "loopback address such as 127.0.0.1")
        bearer = request.headers.get("Authorization", "")
        cookie = _cookie(request)
        offered = [request.query.get("token"), request.cookies.get(cookie),
                   bearer[7:] if bearer.startswith("Bearer ") else None]
        if not any(_same(given, token) for given in offered):
            raise web.HTTPUnauthorized(text="a token is required: open the link "
                                            "`steward web` printed")
        if "token" in request.query:
            rest = request.rel_url.without_query_params("token")
            answer = web.HTTPSeeOther(str(rest))
            answer.set_cookie(cookie, token, httponly=True, samesite="Strict", path="/")
            raise answer
        return await handler(request)
    return guard


@web.middleware
async def errors(request: web.Request, handler):
    """Errors as a page with the reason (escaped), never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.status == 405:  # redirects; 405 keeps its Allow header
            raise
        return _error(exc.status, exc.text or exc.reason)
    except NotFound as exc:
        return _error(404, str(exc))
    except StoreError as exc:  # e.g. a corrupt row: say which
        log.warning("inspector: %s: %s", request.rel_url, exc)
        return _error(500, str(exc))
    except Exception:
        log.exception("inspector: %s failed", request.rel_url)
        return _error(500, "unexpected error; the log of `steward web` says where")


def _error(status: int, message: str) -> web.Response:
    response = page(f"{status}", "", tag("p", message, class_="error"),
                    tag("p", tag("a", "back to the conversations", href="/")))
    response.set_status(status)
    return response


async def _secure(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(HEADERS)


async def _style(request: web.Request) -> web.Response:
    return web.Response(text=CSS, content_type="text/css", charset="utf-8")


def make_app(source: Source, *, token: str, loopback: bool = True) -> web.Application:
    """The inspector over `source`. `token`: required of every request; `loopback`: bound
    to a loopback address, so only loopback Host headers are answered."""
    if not token:
        raise ValueError("the inspector needs a token")
    app = web.Application(middlewares=[_guard(token, loopback), errors])  # guard first
    app[SOURCE] = source
    app.on_response_prepare.append(_secure)
    app.router.add_get("/style.css", _style)
    for path, handler in ROUTES.items():
        app.router.add_get(path, handler)
    return app


async def serve(config: Config, host: str = "127.0.0.1", port: int = 8377,
                token: str | None = None) -> None:
    """`steward web`: serve until SIGTERM or Ctrl-C, to requests that carry the token
    (`token`, else a random one for this start), which the printed link holds."""
    token = check_token(token) if token else secrets.token_urlsafe(24)
    async with open_source(config) as source:
        runner = web.AppRunner(make_app(source, token=token, loopback=is_loopback(host)),
                               access_log=None)
        await runner.setup()
        try:
            try:
                await web.TCPSite(runner, host, port).start()
            except OSError as exc:  # in use, or not an address of this machine: one line
                raise ValueError(f"cannot listen on {host}:{port}: "
                                 f"{exc.strerror or exc}") from None
            bound = runner.addresses[0][1]  # the port the system chose, for port 0
            shown = f"[{host}]" if ":" in host else host
            address = f"http://{shown}:{bound}/?token={token}"
            stopped = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):  # before the link: it may be acted on
                loop.add_signal_handler(sig, stopped.set)
            print(f"steward: the inspector is at {address} (read-only); Ctrl-C to stop",
                  flush=True)
            await stopped.wait()
        finally:
            await runner.cleanup()

