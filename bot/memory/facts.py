"""Long-term facts: what Steward keeps about the people it serves ("my sister lives in
Graz", "I'm vegetarian"), in one versioned document per scope, so what someone said in a
DM stays in their private scope and a shared channel's facts stay in that channel.

The tools only write through `ctx.writes`, which lands with their result: `safe`.
"""

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import Field

from bot.runtime import Policy
from bot.tools import ToolContext, tool
from store import NotFound, Store
from store.documents import Draft

DOC = "facts"
INITIAL = {"items": []}


def namespace(scope: str) -> str:
    return f"facts:{scope}"


async def read_facts(store: Store, scope: str) -> list[dict]:
    try:
        return (await store.read_document(namespace(scope), DOC)).value["items"]
    except NotFound:
        return []


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"\w+", text.lower()) if len(w) > 2}


def relevant_facts(items: list[dict], recent_text: str, budget_chars: int) -> str:
    """The facts for a context, numbered as the tools know them: all of them when they
    fit, else the ones sharing most words with what was said recently (then the newest)."""
    numbered = list(enumerate(items, 1))
    if sum(len(i["text"]) + 8 for _, i in numbered) > budget_chars:
        words = _words(recent_text)
        numbered.sort(key=lambda ni: (len(words & _words(ni[1]["text"])), ni[0]), reverse=True)
    lines, used = [], 0
    for n, item in numbered:
        line = f"{n}. {item['text']}"
        if used + len(line) + 1 > budget_chars:
            break
        lines.append((n, line))
        used += len(line) + 1
    return "\n".join(line for _, line in sorted(lines))


async def facts_for(store: Store, conversation_id: int, budget_chars: int) -> str:
    """The facts block for a conversation's context: its scope's facts, the most relevant
    to what was said lately first when they do not all fit."""
    conversation = await store.get_conversation_by_id(conversation_id)
    items = await read_facts(store, conversation.scope)
    if not items:
        return ""
    recent = await store.entries_page(conversation_id, limit=6)
    said = " ".join(e.text for e in recent if e.kind == "user")
    return relevant_facts(items, said, budget_chars)


async def _scope(ctx: ToolContext) -> str:
    if ctx.conversation_id is None:
        return "private:local"
    return (await ctx.store.get_conversation_by_id(ctx.conversation_id)).scope


async def _edit(ctx: ToolContext, change) -> str:
    scope = await _scope(ctx)
    draft = Draft({"items": await read_facts(ctx.store, scope)})
    problem = change(draft.root["items"])
    if problem:
        return f"error: {problem}"
    if draft.changed:
        ctx.writes.edit_document(namespace(scope), DOC, draft.ops, initial=INITIAL,
                                 history="rewindable", fork_policy="current",
                                 conversation_id=ctx.conversation_id)
    items = draft.value["items"]
    return "Facts now:\n" + "\n".join(f"{n}. {i['text']}" for n, i in enumerate(items, 1)) \
        if items else "No facts kept."


def _stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d")


@tool(policy=Policy.SAFE)
async def remember_fact(
    ctx: ToolContext,
    fact: Annotated[str, Field(description="one self-contained statement, e.g. "
                                           "'Anna's sister lives in Graz'")],
) -> str:
    """Keep a lasting fact about the user or their world for future conversations. Only
    for things worth knowing later (preferences, people, places, standing arrangements)."""
    def change(items):
        if any(i["text"].strip().lower() == fact.strip().lower() for i in items):
            return None
        items.append({"text": fact.strip(), "since": _stamp()})
    return await _edit(ctx, change)


@tool(policy=Policy.SAFE)
async def update_fact(
    ctx: ToolContext,
    number: Annotated[int, Field(description="the fact's number in your memory list")],
    fact: Annotated[str, Field(description="the corrected statement")],
) -> str:
    """Correct a kept fact that changed (a new address, a new preference)."""
    def change(items):
        if not 1 <= number <= len(items):
            return f"there is no fact number {number}"
        items[number - 1] = {"text": fact.strip(), "since": _stamp()}
    return await _edit(ctx, change)


@tool(policy=Policy.SAFE)
async def forget_fact(
    ctx: ToolContext,
    number: Annotated[int, Field(description="the fact's number in your memory list")],
) -> str:
    """Forget a kept fact (it is wrong, outdated, or the user asked you to forget it)."""
    def change(items):
        if not 1 <= number <= len(items):
            return f"there is no fact number {number}"
        del items[number - 1]
    return await _edit(ctx, change)


FACT_TOOLS = [remember_fact, update_fact, forget_fact]
