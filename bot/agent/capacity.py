"""The model's capacity, learned rather than assumed: its context size and whether its
template takes tools.

Asked of its server at every start (bot/llm/discovery.py: a local server answers in
milliseconds), or taken from an overflow error's own words when it did not say; stored in
the database (the document `steward:llm`/`capacity`, one entry per server URL and model),
so a start while the server is down still knows; and applied to `[llm]`
(`LLMConfig.learn`), which the window, the reply's room, compaction and `doctor` read.
The configured `context_window` stays the upper bound: what is learned only lowers it.

Hosted providers (OpenAI's and Anthropic's own URLs) are not asked: their windows are
large, and their model lists do not say. Another hosted server (OpenRouter, say) is asked
once; a server on this machine or the LAN at every start (`nearby`).
"""

from __future__ import annotations

import ipaddress
import logging
import time

import httpx

from bot.config import Config
from bot.llm.discovery import ModelFacts, discover, from_overflow
from bot.llm.errors import ContextOverflow
from store import NotFound, Store, Writes

NAMESPACE, NAME = "steward:llm", "capacity"
HOSTED = ("https://api.openai.com", "https://api.anthropic.com")

log = logging.getLogger(__name__)


def kind_of(client) -> str | None:
    """How to ask the client's server ("llamacpp", "ollama", "compatible"), or None for a
    client that is not an OpenAI-compatible server of the owner's own."""
    base_url = getattr(client, "base_url", "")
    if not base_url or client.provider in ("anthropic", "scripted") \
            or base_url.startswith(HOSTED):
        return None
    return client.provider if client.provider in ("llamacpp", "ollama") else "compatible"


def nearby(base_url: str) -> bool:
    """Whether the server is on this machine or the LAN (asked at every start: it may have
    been restarted with another context size) rather than a hosted one (asked once)."""
    host = httpx.URL(base_url).host
    if host == "localhost" or host.endswith((".local", ".lan", ".home.arpa")):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return "." not in host  # a bare host name on the LAN
    return address.is_private or address.is_loopback or address.is_link_local


def key_of(client) -> str:
    return f"{getattr(client, 'base_url', '')}|{client.model}"


async def stored(store: Store, key: str) -> dict | None:
    """What was learned of the model at `key` before, or None."""
    try:
        value = (await store.read_document(NAMESPACE, NAME)).value
    except NotFound:
        return None
    entry = value.get(key) if isinstance(value, dict) else None
    return entry if isinstance(entry, dict) else None


async def remember(store: Store, key: str, *, context_tokens: int | None,
                   tools: bool | None, source: str) -> None:
    entry = {"context_tokens": context_tokens, "tools": tools, "source": source,
             "at": time.time()}
    writes = Writes()
    writes.edit_document(NAMESPACE, NAME, [{"op": "set", "path": [key], "value": entry}],
                         history="latest", fork_policy="current")
    await store.commit(writes)


def apply(config: Config, entry: dict | ModelFacts) -> None:
    if isinstance(entry, ModelFacts):
        config.llm.learn(context_tokens=entry.context_tokens, tools=entry.tools)
    else:
        config.llm.learn(context_tokens=entry.get("context_tokens"), tools=entry.get("tools"))


async def learn_at_start(store: Store, config: Config, client,
                         http: httpx.AsyncClient) -> dict | None:
    """Ask the client's server what it can hold, store what it says and apply it (else
    apply what was stored before). Returns the entry applied, or None."""
    kind = kind_of(client)
    if kind is None:
        return None
    key = key_of(client)
    before = await stored(store, key)
    if before and not nearby(client.base_url):
        apply(config, before)
        return before
    facts = await discover(http, client.base_url, client.model, kind)
    if facts:
        # A window learned from an overflow (the server's real one) outranks a /models
        # entry that only gives the model's trained size.
        context = facts.context_tokens
        if before and before.get("source") == "overflow" and facts.source == "/models":
            context = min(context or before["context_tokens"], before["context_tokens"])
        entry = {"context_tokens": context, "tools": facts.tools, "source": facts.source}
        if before is None or any(before.get(k) != v for k, v in entry.items()):
            await remember(store, key, **entry)
        before = entry
    if before:
        apply(config, before)
        log.info("llm: %s %s holds %s tokens (%s)%s", client.provider, client.model,
                 before.get("context_tokens") or "?", before.get("source") or "stored",
                 "; its template drops tools" if before.get("tools") is False else "")
    return before


async def learn_from_overflow(store: Store, config: Config, client,
                              error: ContextOverflow) -> int | None:
    """The context size an overflow error states: stored and applied, so the next request
    is made for it. None when the error does not say."""
    said = from_overflow(error.body, str(error))
    if not said or said >= config.llm.window:
        return None
    tools = config.llm.tools_said
    await remember(store, key_of(client), context_tokens=said, tools=tools, source="overflow")
    config.llm.learn(context_tokens=said)
    log.warning("llm: the server holds %d tokens, not %d: requests are made for that now",
                said, config.llm.context_window)
    return said
