"""Search across every conversation: the one retrieval `steward search` uses
(`bot.memory.retrieval.remember`: the words, the question's time, and the embeddings when
hybrid search is on), best first, each hit with its neighbours and a link that opens its
transcript at the hit."""

import re
import time

from aiohttp import web

from bot.app.inspector.html import Html, link, tag, url
from bot.app.inspector.pages.layout import int_param, page, said, source, text_param, zone
from bot.memory import embeddings
from bot.memory.retrieval import excerpt, remember
from store.search import MAX_QUERY_CHARS, parse_query, query_terms

PER_PAGE = 20
SPEAKERS = {"user": "", "assistant": "Steward", "tool_result": "tool", "compaction": "summary"}


def marked(text: str, query: str) -> Html:
    """`text` escaped, with the words the search looked up in <mark>."""
    words = sorted({w for t in query_terms(parse_query(query)) for w in [t.text, *t.text.split()]
                    if len(w) > 1}, key=len, reverse=True)
    if not words:
        return tag("span", text)
    pattern = re.compile("|".join(re.escape(w) for w in words), re.IGNORECASE)
    parts, last = [], 0
    for m in pattern.finditer(text):
        parts += [text[last:m.start()], tag("mark", m.group())]
        last = m.end()
    parts.append(text[last:])
    return tag("span", parts)


def _speaker(e) -> str:
    label = SPEAKERS.get(e.kind, e.kind)
    if e.author:
        return e.author
    return label or "someone"


async def search(request: web.Request) -> web.Response:
    src = source(request)
    query = (text_param(request, "q") or "").strip()[:MAX_QUERY_CHARS]
    key = text_param(request, "key")
    number = int_param(request, "page", low=1, default=1)
    if not query:
        return page("Search", "", tag("p", "Words, a name or a question (\"what did Anna "
                                           "say about the gym?\"); \"quoted text\" must "
                                           "occur as written.", class_="meta"), query="")
    owner_zone = zone(request)
    now = time.time()
    hits = await remember(src.store, query, conversation_key=key, limit=PER_PAGE + 1,
                          offset=(number - 1) * PER_PAGE, zone=owner_zone,
                          embedder=embeddings.attached(src.store))
    more, hits = len(hits) > PER_PAGE, hits[:PER_PAGE]
    results = []
    for h in hits:
        e = h.entry
        at = url("/transcript", key=h.conversation_key, at=e.seq) + f"#e{e.seq}"
        head = [tag("a", h.conversation_key, href=url("/transcript", key=h.conversation_key),
                    class_="conversation"),
                f" · #{e.seq} · ", said(e.created_at, owner_zone, now),
                tag("a", "show in the conversation", href=at, class_="open")]
        # A hit may rank by its neighbours' words (a reply to the question that held
        # them): they are marked where they show too.
        near = [tag("div", f"{_speaker(n)}: ", marked(excerpt(n.text, query, 160), query),
                    class_="near") for n in h.before]
        after = [tag("div", f"{_speaker(n)}: ", marked(excerpt(n.text, query, 160), query),
                     class_="near") for n in h.after]
        results.append(tag("article", tag("div", head, class_="head"), near,
                           tag("div", tag("b", f"{_speaker(e)}: "),
                               marked(excerpt(e.text, query, 500), query), class_="said"),
                           after, class_="entry hit"))
    pager = []
    if number > 1:
        pager.append(link("← better matches", "/search", q=query, key=key, page=number - 1))
    if more:
        pager.append(link("more matches →", "/search", q=query, key=key, page=number + 1))
    scope = f" in {key}" if key else ""
    title = f"Search{scope}: {query}"
    found = (results if results else
             tag("p", f"no matches for “{query}”{scope}", class_="empty"))
    return page(title, "", tag("p", "Best matches first: the words (stemmed, so “climb” "
                                    "finds “climbing”), who said them, and how recent.",
                               class_="meta"),
                found, tag("div", pager, class_="pager"), query=query)
