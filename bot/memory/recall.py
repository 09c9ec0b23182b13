"""Relevant memories for a turn: what the full-history search finds, in the conversation's
own scope, for the words of the newest message — but only what the context window no
longer holds (older than the summary's cut, or said in another conversation of the same
scope). Volatile, so it goes late in the context.

A fork is its own timeline: it recalls its own entries and its ancestors' up to the fork
point, never what the parent said after the fork, nor a sibling or child fork's entries
(other branches of the same family); conversations outside the family are recalled as
usual. The search itself knows only scopes, so the family rule filters its results."""

import re
from datetime import UTC, datetime

from store import Conversation, Entry, Store

MAX_HITS = 3
SEARCH_PAGES = 3  # pages of hits looked through per word when a fork filters many out
MAX_CHARS = 1500
STOP = frozenset("this that with from have what when where which would could should about "
                 "there their them they your yours please thanks".split())


def keywords(text: str, n: int = 3) -> list[str]:
    """The few most telling words of a message (longest first): searched one by one,
    because every word of a search must match."""
    words = {w.lower() for w in re.findall(r"\w{4,}", text)} - STOP
    return sorted(words, key=lambda w: (-len(w), w))[:n]


class _Timeline:
    """Which entries a conversation's own timeline holds, by fork lineage: its own, and
    each ancestor's up to the (smallest) fork point below it. Entries of another
    conversation of the same fork family are other branches; of an unrelated
    conversation, memories in scope."""

    def __init__(self, store: Store, conversation: Conversation):
        self.store = store
        self.conversation = conversation
        self.bounds: dict[int, int | None] = {}
        self.roots: dict[int, int] = {}
        self.root: int | None = None

    async def _parent(self, conversation_id: int) -> tuple[int | None, int | None]:
        c = (self.conversation if conversation_id == self.conversation.id
             else await self.store.get_conversation_by_id(conversation_id))
        return c.parent_id, c.fork_at

    async def _root_of(self, conversation_id: int) -> int:
        chain = []
        current = conversation_id
        while current not in self.roots:
            parent, _ = await self._parent(current)
            chain.append(current)
            if parent is None:
                self.roots[current] = current
                break
            current = parent
        for c in chain:
            self.roots[c] = self.roots[current]
        return self.roots[conversation_id]

    async def _load(self) -> None:
        if self.root is not None:
            return
        bound, current = None, self.conversation.id
        while True:
            self.bounds[current] = bound
            parent, fork_at = await self._parent(current)
            if parent is None:
                break
            bound = fork_at if bound is None else min(bound, fork_at)
            current = parent
        self.root = current

    async def allows(self, entry: Entry) -> bool:
        await self._load()
        cid = entry.conversation_id
        if cid in self.bounds:
            bound = self.bounds[cid]
            return bound is None or entry.seq <= bound
        return await self._root_of(cid) != self.root


async def recall(store: Store, conversation: Conversation, text: str, *,
                 in_window: set[int]) -> str:
    if not conversation.head_seq and conversation.parent_id is None:
        # Nothing has left this conversation's window yet; other conversations of the
        # scope are only looked at once it has history of its own to lose.
        return ""
    timeline = _Timeline(store, conversation)
    found = {}
    for word in keywords(text):
        kept = 0
        for page in range(SEARCH_PAGES):
            hits = await store.search(word, scopes=[conversation.scope], limit=MAX_HITS * 3,
                                      offset=page * MAX_HITS * 3, context=0)
            for hit in hits:
                e = hit.entry
                if e.id in in_window or e.kind == "compaction":
                    continue
                if not await timeline.allows(e):
                    continue
                kept += 1
                if e.id not in found or found[e.id][0] < hit.score:
                    found[e.id] = (hit.score, hit)
            if kept >= MAX_HITS or len(hits) < MAX_HITS * 3:
                break
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
