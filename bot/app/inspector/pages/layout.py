"""What every page shares: the frame with its navigation, times, JSON, and reading the
query string (a bad parameter is the asker's mistake: 400, not a traceback)."""

import json
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from aiohttp import web

from bot.app.inspector.html import Html, tag
from bot.app.inspector.source import Source
from bot.app.inspector.words import moment_in_words, zone_of
from store import NotFound, Store

SOURCE = web.AppKey("source", Source)
NAV = [("/", "Conversations"), ("/tasks", "Tasks"), ("/approvals", "Approvals"),
       ("/schedules", "Schedules"), ("/health", "Health"), ("/quarantine", "Quarantine"),
       ("/usage", "Usage")]
PAGE_SIZE = 50
SHOWN_CHARS = 20_000  # of a JSON value or a text; pinned requests and attachments are big


def source(request: web.Request) -> Source:
    return request.app[SOURCE]


def page(title: str, section: str, *body, query: str | None = None) -> web.Response:
    """The frame: navigation, and the search box on every page (`query`: its text)."""
    nav = [tag("a", label, href=path, class_="here" if path == section else None)
           for path, label in NAV]
    search = tag("form", tag("input", type="search", name="q", value=query or "",
                             placeholder="Search all conversations", aria_label="search",
                             size=28),
                 tag("button", "Search", type="submit"),
                 action="/search", method="get", role="search", class_="search")
    document = Html("<!doctype html>") + tag(
        "html", tag("head", tag("meta", charset="utf-8"),
                    tag("meta", name="viewport", content="width=device-width"),
                    tag("title", f"{title} · Steward"),
                    tag("link", rel="icon", href="data:,"),  # no /favicon.ico request
                    tag("link", rel="stylesheet", href="/style.css")),
        tag("body", tag("header", tag("span", "Steward inspector", class_="brand"),
                        tag("nav", nav), search),
            tag("main", tag("h1", title), body)), lang="en")
    return web.Response(text=document, content_type="text/html", charset="utf-8")


def zone(request: web.Request) -> ZoneInfo:
    """The owner's zone (`[agent] timezone`), in which the pages say times in words."""
    return zone_of(source(request).config.agent.timezone)


def said(t: float | None, zone: ZoneInfo, now: float | None = None) -> Html:
    """A time in words ("today 09:12"), with the exact UTC time on hover."""
    if t is None:
        return Html("-")
    return tag("time", moment_in_words(t, zone, time.time() if now is None else now),
               title=when(t), datetime=datetime.fromtimestamp(t, UTC).isoformat())


def when(t: float | None) -> str:
    """UTC, as `steward log` and the JSONL format write times."""
    if t is None:
        return "-"
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n… ({len(text) - limit} more)"


def as_json(value) -> Html:
    return tag("pre", clip(json.dumps(value, indent=2, ensure_ascii=False, default=str)))


def folded(summary: str, value) -> Html:
    """A JSON value behind a <details> (open it without any script)."""
    if value is None or value == {} or value == []:
        return Html("")
    return tag("details", tag("summary", summary), as_json(value))


def text_param(request: web.Request, name: str, *, required: bool = False) -> str | None:
    value = request.query.get(name)
    if required and not value:
        raise web.HTTPBadRequest(text=f"the parameter {name!r} is required")
    return value or None


def int_param(request: web.Request, name: str, *, low: int = 0,
              default: int | None = None) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name} must be a whole number, not {raw!r}") from None
    if value < low:
        raise web.HTTPBadRequest(text=f"{name} must be {low} or more, not {value}")
    return value


def state_class(state: str) -> Html:
    return tag("span", state, class_=f"state-{state}")


def decoded(raw: str | None):
    """A JSON column the store hands over as text (a submission's payload)."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw


async def conversation_keys(store: Store, ids) -> dict[int, str]:
    """Conversation id -> key, for the ids a listing shows (one read per distinct id)."""
    found = {}
    for i in {i for i in ids if i is not None}:
        try:
            found[i] = (await store.get_conversation_by_id(i)).key
        except NotFound:
            found[i] = f"(missing conversation {i})"
    return found
