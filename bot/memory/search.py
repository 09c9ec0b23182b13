"""Full-history search for the agent (`search_history`); `steward search` and the shared
retrieval are in bot/memory/retrieval.py.

The agent only ever searches the asking conversation's scope: what a person said in a DM
(scope "private:<person>") never reaches anyone else, and a shared channel
("channel:<id>") sees only what was said in it. The CLI is the owner's view of the whole
store, optionally narrowed to one session. Ranking and query syntax: `store/search.py`
(any word of a question counts, none is required).

The tool only reads the store: `safe`.
"""

from dataclasses import replace
from datetime import datetime, tzinfo
from typing import Annotated

from pydantic import Field

from bot.memory import embeddings as _embeddings
from bot.memory.retrieval import (  # noqa: F401 (re-exported: the CLI and recall's names)
    _speaker,
    _zone,
    excerpt,
    hit_json,
    remember,
    search_command,
)
from bot.runtime import Policy
from bot.tools import ToolContext, tool
from bot.tools.permissions import PRIVATE, READS_OUTSIDE
from store import Conversation, Entry, Hit, NotFound, Store

__all__ = ["MAX_LIMIT", "excerpt", "hit_json", "remember", "render_hits", "search_command",
           "search_history"]

MAX_LIMIT = 20
HIT_CHARS = 400  # of a hit's text shown to the model, around the first match
NEIGHBOUR_CHARS = 160


def render_hits(hits: list[Hit], query: str, *, page: int, limit: int, zone: tzinfo) -> str:
    """Hits as compact text for the model: when, where, who, the match and its
    neighbours, each cut to a few hundred characters."""
    if not hits:
        return (f"No matches for {query!r}." if page == 1
                else f"No more matches for {query!r} (page {page}).")
    first = (page - 1) * limit + 1
    lines = [f"Results {first}-{first + len(hits) - 1} for {query!r}, best first:"]
    for n, h in enumerate(hits, first):
        when = datetime.fromtimestamp(h.entry.created_at, zone).strftime(
            "%a %Y-%m-%d %H:%M %Z")
        lines.append(f"{n}. {when} · {h.conversation_key} · #{h.entry.seq}")
        for e in h.before:
            lines.append(f"   … {_speaker(e)}: {excerpt(e.text, query, NEIGHBOUR_CHARS)}")
        lines.append(f"   > {_speaker(h.entry)}: {excerpt(h.entry.text, query, HIT_CHARS)}")
        for e in h.after:
            lines.append(f"   … {_speaker(e)}: {excerpt(e.text, query, NEIGHBOUR_CHARS)}")
    if len(hits) == limit:
        lines.append(f"(More may match: page={page + 1}.)")
    return "\n".join(lines)


async def visible_scopes(store: Store, conversation: Conversation) -> list[str]:
    """What a search from this conversation may see: its own scope; from a person's private
    conversation, also the channels where that person talked with Steward (never the
    other way round: a channel's search does not reach anyone's private scope)."""
    scopes = [conversation.scope]
    if conversation.scope.startswith("private:") and conversation.owner:
        scopes += await store.shared_scopes_of(conversation.owner)
    return scopes


# Hits are old text, much of it from outside (mail, pages quoted): data, never permission.
@tool(policy=Policy.SAFE, touches=frozenset({PRIVATE, READS_OUTSIDE}))
async def search_history(
    ctx: ToolContext,
    query: Annotated[str, Field(
        min_length=1, max_length=500,
        description='a question or words: every word counts, none is required; '
                    '"quoted words" must occur as written; word* for words starting so')],
    limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description="results per page")] = 5,
    page: Annotated[int, Field(ge=1, description="1 for the best matches, then 2, 3…")] = 1,
    answers: Annotated[bool, Field(
        description="also your own earlier answers (default: what people said)")] = False,
) -> str:
    """Search everything said before that you may see here — earlier messages, older
    conversations, compacted history. Ask in plain words ("when did Anna go climbing?"):
    rare words and the speaker's name weigh most, word forms are matched ("climbed",
    "climbing"), "exact phrases" are required. Best and most recent matches first, each
    with its date, conversation and neighbouring messages."""
    if ctx.conversation_id is None:
        return "error: search_history needs a conversation"
    conversation = await ctx.store.known_conversation(ctx.conversation_id)
    zone = await _zone(ctx.timezone)
    asking = await _asking_turn(ctx)
    hits = await remember(ctx.store, query, scopes=await visible_scopes(ctx.store, conversation),
                          limit=limit + 1, offset=(page - 1) * limit, zone=zone,
                          embedder=_embeddings.attached(ctx.store), answers=answers or None)
    hits = [_without(h, asking) for h in hits if not _asked(h.entry, asking)][:limit]
    return render_hits(hits, query, page=page, limit=limit, zone=zone)


TURN = "turn"  # bot.agent.inbox.TURN (memory sits below the agent and cannot import it)


async def _asking_turn(ctx: ToolContext) -> str | None:
    """The turn this call works for (through an approval, if it waited for one): the
    message that turn answers is in the model's context, and no hit of its own search."""
    task_id: str | None = ctx.task_id
    for _ in range(3):  # tool call -> (approval ->) turn
        try:
            task = await ctx.store.get_task(task_id)
        except NotFound:
            return None
        if task.kind == TURN:
            return task.id
        task_id = task.parent_id
        if task_id is None:
            return None
    return None


def _asked(e: Entry, turn: str | None) -> bool:
    return turn is not None and e.kind == "user" and e.task_id == turn


def _without(h: Hit, turn: str | None) -> Hit:
    if turn is None:
        return h
    return replace(h, before=tuple(e for e in h.before if not _asked(e, turn)),
                   after=tuple(e for e in h.after if not _asked(e, turn)))
