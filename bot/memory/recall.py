"""Relevant memories for a turn: what the full-history search ranks best, in the
conversation's own history first, then in the rest of its scope, for the newest message as
a whole (a question in plain words: store/search.py weighs every word by how rare it is,
stems them, and knows who said what) — but only what the context window no longer holds
(older than the summary's cut, or said in another conversation of the same scope).
Volatile, so it goes late in the context.

As many memories as fit the room the context gives (`room` characters, default
`MAX_CHARS`; at most `MAX_HITS`), best first, each `HIT_CHARS` around the first matching
word, with the turn before and after it (`NEIGHBOUR_CHARS`: the question it answers, the
reply that answers it); a hit scoring under `RELATIVE_FLOOR` of the best one kept is left
out (it shares a word or two, not the topic), and a message without a word of three
letters ("ok", "hi") recalls nothing. History the window does not hold is recalled from
the first turn on, an import's included, whether or not a compaction has run. What is
recalled is what people said, never Steward's own answers (a message to Steward says
"you" to it: that is no question about its answers).

A fork is its own timeline: it recalls its own entries and its ancestors' up to the fork
point, never what the parent said after the fork, nor a sibling or child fork's entries
(other branches of the same family); conversations outside the family are recalled as
usual. The search itself knows only scopes, so the family rule filters its results."""

from datetime import UTC, datetime, tzinfo

from bot.memory import embeddings as _embeddings
from bot.memory.search import excerpt, remember
from bot.memory.transcript import WITHDRAWN
from bot.provenance import Marked, of_entry
from store import Conversation, Entry, NotFound, Store
from store.search import evidence, parse_query, query_terms

MAX_HITS = 20
PAGE = 20  # hits read per search; up to SEARCH_PAGES when many are filtered out
SEARCH_PAGES = 3
HIT_CHARS = 400
NEIGHBOUR_CHARS = 200
MAX_CHARS = 1500
RELATIVE_FLOOR = 0.3


def worth_searching(text: str) -> bool:
    """Whether a message has something to look up: a word of three letters or more that is
    not a stop word, a quoted text, or CJK."""
    return any(t.cjk or t.quoted or len(t.text) >= 3 for t in query_terms(parse_query(text))
               if not t.stop)


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
             else await self.store.known_conversation(conversation_id))
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


async def _taken_back(store: Store, entry: Entry) -> bool:
    """A message its sender deleted before it was answered: its turn was withdrawn, and it
    is left out of the model's context (bot.agent.inbox), so out of recall too."""
    if entry.kind != "user" or not entry.task_id:
        return False
    try:
        result = (await store.get_task(entry.task_id)).result
    except NotFound:  # an imported message names no task of this store
        return False
    return isinstance(result, dict) and bool(result.get(WITHDRAWN))


async def recall(store: Store, conversation: Conversation, text: str, *,
                 in_window: set[int], zone: tzinfo = UTC, at: float | None = None,
                 room: int = MAX_CHARS) -> str:
    """The memories for `text`, a line each ("- date speaker: excerpt"), each followed by
    its neighbours ("  … speaker: excerpt"), in at most `room` characters (the date in
    `zone`, the asker's; a time phrase of the message is read there as of `at`), marked
    (`Marked`) when any of them is outside text (a forwarded mail, a page's words)."""
    if conversation.parent_id is None and not conversation.head_seq \
            and len(in_window) >= conversation.last_seq:
        # The window holds the whole conversation: other conversations of the scope are
        # only looked at once it has history of its own to lose.
        return ""
    if not worth_searching(text):
        return ""
    timeline = _Timeline(store, conversation)

    async def best(where: dict) -> list:
        """The hits of one search that recall may show, best first, floored."""
        kept = []
        for page in range(SEARCH_PAGES):
            hits = await remember(store, text, **where, limit=PAGE, offset=page * PAGE,
                                  context=1, zone=zone, at=at,
                                  embedder=_embeddings.attached(store), answers=False)
            for hit in hits:
                e = hit.entry
                if e.id in in_window or e.kind == "compaction" or not e.text.strip():
                    continue
                if await timeline.allows(e) and not await _taken_back(store, e):
                    kept.append(hit)
            if len(kept) >= MAX_HITS or len(hits) < PAGE:
                break
        return [h for h in kept[:MAX_HITS] if h.score >= RELATIVE_FLOOR * kept[0].score]

    # The conversation's own history first, then the rest of its scope: ranked together,
    # another conversation's look-alikes (someone else's new apartment) outrank the
    # turn this conversation is asking about, and its words' statistics drown its own.
    own = await best({"conversation_key": conversation.key})
    ids = {h.entry.id for h in own}
    kept = own + [h for h in await best({"scopes": [conversation.scope]})
                  if h.entry.id not in ids]
    lines, used, outside = [], 0, None
    shown = set(in_window)
    for hit in kept[:MAX_HITS]:
        e = hit.entry
        if e.id in shown:
            continue
        when = datetime.fromtimestamp(e.created_at, zone).strftime("%Y-%m-%d")
        block = [f"- {when} {e.author or e.kind}: {excerpt(e.text, text, HIT_CHARS)}"]
        around = [n for n in (*hit.before, *hit.after)  # what people said, never Steward's
                  if n.id not in shown and n.text.strip() and evidence(n)
                  and await timeline.allows(n) and not await _taken_back(store, n)]
        block += [f"  … {n.author or n.kind}: {excerpt(n.text, text, NEIGHBOUR_CHARS)}"
                  for n in around]
        size = sum(len(line) + 1 for line in block)
        if used + size > room:
            if used + len(block[0]) + 1 > room:
                break
            block, around, size = block[:1], [], len(block[0]) + 1
        lines += block
        used += size
        shown |= {e.id, *(n.id for n in around)}
        for x in (e, *around):
            outside = outside or of_entry(x)
    return Marked("\n".join(lines), outside)
