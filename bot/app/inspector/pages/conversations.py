"""Conversations, a transcript page by page, the exact context, documents as of an entry."""

import json
import time
from datetime import datetime

from aiohttp import web

from bot.agent.approval import KIND as APPROVAL
from bot.agent.context import assemble
from bot.app.inspector.html import Html, link, table, tag, url
from bot.app.inspector.pages.layout import (
    PAGE_SIZE,
    as_json,
    clip,
    conversation_keys,
    folded,
    int_param,
    page,
    said,
    source,
    text_param,
    zone,
)
from bot.app.inspector.words import amount
from bot.tools.builtin import TODO_DOCUMENT
from store import NotFound, conversation_namespace

# Documents a conversation may have under a fixed name; attachments are found through the
# entries that name them. (The store has no listing of a namespace's documents.)
KNOWN_DOCUMENTS = (TODO_DOCUMENT,)
ABOVE_HIT = 5  # newer entries shown above an entry a link lands at


async def index(request: web.Request) -> web.Response:
    src = source(request)
    store = src.store
    before = int_param(request, "before_id", low=1)
    counts = await store.count_tasks()
    approvals = await store.list_tasks(kind=APPROVAL, active=True, limit=100)
    quarantined = await store.list_submissions(state="quarantined", limit=100)
    owner_zone = zone(request)
    midnight = datetime.now(owner_zone).replace(hour=0, minute=0, second=0, microsecond=0)
    spent = await store.spend_since(midnight.timestamp()) * src.config.limits.per_usd

    def card(label, value, href):
        return tag("a", tag("div", tag("b", value), label, class_="card"), href=href)

    def capped(rows):
        return f"{len(rows)}+" if len(rows) >= 100 else str(len(rows))

    active = sum(n for state, n in counts.items() if state in ("pending", "running", "waiting"))
    cards = tag("div", card("active tasks", active, "/tasks"),
                card("failed tasks", counts.get("failed", 0), url("/tasks", state="failed")),
                card("approvals pending", capped(approvals), "/approvals"),
                card("quarantined", capped(quarantined), "/quarantine"),
                card(f"spent today ({src.config.limits.currency})", amount(spent), "/usage"),
                class_="cards")
    found = await store.list_conversations(limit=PAGE_SIZE, before_id=before)
    parents = await conversation_keys(store, [c.parent_id for c in found])
    rows = [[link(c.key, "/transcript", key=c.key), c.owner or "-", c.scope, c.last_seq,
             [link(parents[c.parent_id], "/transcript", key=parents[c.parent_id]),
              f" at {c.fork_at}"] if c.parent_id else "-", said(c.updated_at, owner_zone)]
            for c in found]
    more = (tag("div", link("older conversations →", "/", before_id=found[-1].id),
                class_="pager") if len(found) == PAGE_SIZE else "")
    return page("Conversations", "/", cards,
                table(["key", "owner", "scope", "entries", "forked from", "updated"], rows,
                      "no conversations yet"), more)


def _entry(key: str, e, zone, now: float, hit: bool = False) -> Html:
    data = e.data if isinstance(e.data, dict) else {}
    head = [tag("b", f"#{e.seq}"), f" · {e.kind}",
            [" · ", tag("b", e.author)] if e.author else "", " · ", said(e.created_at, zone, now),
            f" · ref {e.ref}" if e.ref else "", " · ",
            link("documents as of here", "/document", key=key, at=e.seq)]
    calls = [tag("div", f"→ {c.get('name')}(",
                 json.dumps(c.get("arguments"), ensure_ascii=False), ")", class_="call")
             for c in data.get("tool_calls", []) if isinstance(c, dict)]
    attached = [tag("div", "attachment: ",
                    link(a.get("filename") or a["document"], "/document", key=key,
                         name=a["document"], at=e.seq))
                for a in (data.get("email") or {}).get("attachments", [])
                if isinstance(a, dict) and a.get("document")]
    return tag("article", tag("div", head, class_="head"),
               tag("pre", clip(e.text)) if e.text else "", calls, attached,
               folded("data", e.data), class_=f"entry kind-{e.kind}" + (" hit" if hit else ""),
               id=f"e{e.seq}")


async def transcript(request: web.Request) -> web.Response:
    """One page of entries, newest first, read by key (`entries_page`: the seq either side
    of the page, never an offset), so the 10,000th page costs what the first does.

    No parameter: the newest page. `before=N`: the page older than entry N; `after=N`: the
    page newer than N (`after=0`: the oldest page); `at=N`: the page that holds entry N,
    a few newer ones above it (a search hit's link), N marked."""
    store = source(request).store
    key = text_param(request, "key", required=True)
    before = int_param(request, "before", low=1)
    after = int_param(request, "after", low=0)
    at = int_param(request, "at", low=1)
    if at is not None and before is None and after is None:
        before = at + ABOVE_HIT + 1
    conv = await store.get_conversation(key)
    entries = await store.entries_page(conv.id, before=before, after=after, limit=PAGE_SIZE)
    entries = entries[::-1]  # newest first
    meta = [f"owner {conv.owner or '-'} · scope {conv.scope} · {conv.last_seq} entries, "
            "newest first",
            f" · context starts after the summary at #{conv.head_seq}" if conv.head_seq
            else "", " · ", link("exact context", "/context", key=key), " · ",
            link("documents", "/document", key=key), " · ",
            link("tasks", "/tasks", key=key)]
    if conv.parent_id is not None:
        parent = (await conversation_keys(store, [conv.parent_id]))[conv.parent_id]
        meta += [" · forked from ", link(parent, "/transcript", key=parent), f" at #{conv.fork_at}"]
    pager = []
    if entries and entries[0].seq < conv.last_seq:
        pager += [link("⇤ newest", "/transcript", key=key),
                  link("← newer", "/transcript", key=key, after=entries[0].seq)]
    if entries and entries[-1].seq > 1:
        pager += [link("older →", "/transcript", key=key, before=entries[-1].seq),
                  link("oldest ⇥", "/transcript", key=key, after=0)]
    zone_ = zone(request)
    now = time.time()
    body = ([_entry(key, e, zone_, now, hit=e.seq == at) for e in entries] if entries else
            tag("p", "no entries here", class_="empty"))
    find = tag("form", tag("input", type="hidden", name="key", value=key),
               tag("input", type="search", name="q", placeholder="Search this conversation",
                   aria_label="search this conversation", size=28),
               tag("button", "Search", type="submit"),
               action="/search", method="get", class_="inline")
    return page(key, "/", tag("p", meta, class_="meta"), find,
                tag("div", pager, class_="pager"), body, tag("div", pager, class_="pager"))


async def context(request: web.Request) -> web.Response:
    src = source(request)
    key = text_param(request, "key", required=True)
    conv = await src.store.get_conversation(key)
    assembled = await assemble(src.store, src.config, conv.id, tools=src.tools,
                                    model=src.model)
    r, window = assembled.request, assembled.window
    meta = tag("p", f"model {r.model or '(default)'} · up to {r.max_tokens} output tokens · "
                    f"about {assembled.estimated_tokens} input tokens · "
                    f"{len(window.entries)} entries after #{window.cut_seq}"
                    + ("" if window.complete else " (older ones did not fit)") + " · ",
               link("transcript", "/transcript", key=key), class_="meta")
    tools = [tag("details", tag("summary", tag("b", t.name), f" — {t.description}"),
                 as_json(t.parameters)) for t in r.tools]
    messages = []
    for m in r.messages:
        label = [tag("b", m.role), f" [{m.tool_call_id}]" if m.tool_call_id else "",
                 f" {m.name}" if m.name else "", " (error)" if m.is_error else ""]
        calls = [tag("div", f"→ {c.name}(", json.dumps(c.arguments, ensure_ascii=False),
                     f") [{c.id}]", class_="call") for c in m.tool_calls]
        messages.append(tag("article", tag("div", label, class_="head"),
                            tag("pre", clip(m.content)) if m.content else "", calls,
                            class_=f"message role-{m.role}"))
    return page(f"Context of {key}", "/", meta,
                tag("h2", f"Tools ({len(r.tools)})"),
                tools or tag("p", "no tools", class_="empty"),
                tag("h2", f"Messages ({len(r.messages)})"), messages)


async def document(request: web.Request) -> web.Response:
    store = source(request).store
    key = text_param(request, "key", required=True)
    name = text_param(request, "name")
    at = int_param(request, "at", low=0)
    conv = await store.get_conversation(key)
    namespace = conversation_namespace(conv.id)
    form = tag("form", tag("input", type="hidden", name="key", value=key),
               tag("label", "name ", tag("input", name="name", value=name or "", size=24)),
               tag("label", "as of entry ", tag("input", name="at", type="number", min=0,
                                                value="" if at is None else at, size=6)),
               tag("button", "show", type="submit"),
               action="/document", method="get", class_="inline")
    back = tag("p", link(f"← {key}", "/transcript", key=key), class_="meta")
    if name is None:
        rows = []
        for known in KNOWN_DOCUMENTS:
            try:
                newest = await store.read_document(namespace, known)
            except NotFound:
                continue
            rows.append([link(known, "/document", key=key, name=known, at=at), newest.version,
                         "-" if newest.at_seq is None else f"#{newest.at_seq}"])
        return page(f"Documents of {key}" + ("" if at is None else f" as of #{at}"), "/",
                    back, form, table(["name", "newest version", "written at"], rows,
                                      "no documents under a known name (attachments are "
                                      "linked from their entries)"))
    try:
        doc = await store.read_document(namespace, name)
    except NotFound:
        raise web.HTTPNotFound(text=f"{key} has no document {name!r}") from None
    if at is not None:
        try:
            doc = await store.read_document(namespace, name, as_of_seq=at)
        except NotFound:
            raise web.HTTPNotFound(text=f"document {name!r} of {key} did not exist yet at "
                                        f"entry {at}") from None
    steps = []
    if doc.at_seq:
        steps.append(link("← the version before", "/document", key=key, name=name,
                          at=doc.at_seq - 1))
    if at is not None:
        steps.append(link("newest ⇥", "/document", key=key, name=name))
    written = ("its initial value" if doc.at_seq is None else
               tag("a", f"written at entry #{doc.at_seq}",
                   href=url("/transcript", key=key, before=doc.at_seq + 1) + f"#e{doc.at_seq}"))
    where = "newest" if at is None else f"as of entry #{at}"
    return page(f"{name} — {key}", "/", back, form,
                tag("p", f"version {doc.version} ({where}) · ", written, class_="meta"),
                tag("div", steps, class_="pager"), as_json(doc.value))
