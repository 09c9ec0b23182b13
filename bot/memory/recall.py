"""Relevant memories for a turn: what the full-history search finds, in the conversation's
own scope, for the words of the newest message — but only what the context window no
longer holds (older than the summary's cut, or said in another conversation of the same
scope). Volatile, so it goes late in the context."""

import re
from datetime import UTC, datetime

from store import Conversation, Store

MAX_HITS = 3
MAX_CHARS = 1500
STOP = frozenset("this that with from have what when where which would could should about "
                 "there their them they your yours please thanks".split())


def keywords(text: str, n: int = 3) -> list[str]:
    """The few most telling words of a message (longest first): searched one by one,
    because every word of a search must match."""
    words = {w.lower() for w in re.findall(r"\w{4,}", text)} - STOP
    return sorted(words, key=lambda w: (-len(w), w))[:n]


async def recall(store: Store, conversation: Conversation, text: str, *,
                 in_window: set[int]) -> str:
    if not conversation.head_seq and conversation.parent_id is None:
        # Nothing has left this conversation's window yet; other conversations of the
        # scope are only looked at once it has history of its own to lose.
        return ""
    found = {}
    for word in keywords(text):
        for hit in await store.search(word, scopes=[conversation.scope], limit=MAX_HITS,
                                      context=0):
            e = hit.entry
            if e.id in in_window or e.kind == "compaction":
                continue
            if e.id not in found or found[e.id][0] < hit.score:
                found[e.id] = (hit.score, hit)
    lines, used = [], 0
    for _, hit in sorted(found.values(), key=lambda sh: -sh[0])[:MAX_HITS]:
        e = hit.entry
        when = datetime.fromtimestamp(e.created_at, UTC).strftime("%Y-%m-%d")
        line = f"- {when} {e.author or e.kind}: {e.text[:400]}"
        if used + len(line) > MAX_CHARS:
            break
        lines.append(line)
        used += len(line)
    return "\n".join(lines)
