"""Compaction: old history becomes a summary entry (a head marker) so the context window
stays within bounds; the old entries stay on disk and searchable.

A compaction is a workflow task like any other: it picks the cut, spawns an `llm_call`
for the summary (an effect sandwich, with its usage in the ledger), and on success appends
the summary as a `compaction` entry that becomes the conversation's head in the same
commit. A failed summary loses nothing: the turn goes on with the oldest entries left out
of its window, and compaction is tried again later with backoff.

The cut keeps about `keep_recent_tokens` of the newest history verbatim and always falls
just before a user message, so a tool call is never separated from its result.
"""

import time

from bot.agent.context import PAGE, SPOKEN, entry_chars, head_of
from bot.agent.deps import AgentDeps
from bot.llm.types import Message, Request
from bot.runtime import Done, Fail, TaskContext, TaskDef, Wait
from store import DONE, FAILED, Entry, Store

KIND = "compact"
BACKOFF_BASE, BACKOFF_MAX = 60.0, 3600.0

SUMMARY_PROMPT = """You maintain the running summary of a long conversation between a user and
their assistant. Write a new summary that replaces the previous one (if given) and covers
the new messages. Keep: what the user asked for and decided, facts about them and their
world, open tasks, promises and commitments with dates, names, numbers and links that
may matter later. Drop small talk and tool output details. Write in the conversation's
language, as compact notes, under {words} words. End with one line saying that older
messages are stored and can be found with the search_history tool."""


async def choose_cut(store: Store, conversation_id: int, *, after: int, last_seq: int,
                     keep_chars: int) -> int | None:
    """The position to summarise up to: everything after it (about `keep_chars` of the
    newest spoken history) stays verbatim, and what follows the cut starts with a user
    message. None when there is nothing worth summarising."""
    kept, before = 0, last_seq + 1
    while True:
        page = await store.entries_page(conversation_id, before=before, limit=PAGE)
        for entry in reversed(page):
            if entry.seq <= after:
                return None
            if entry.kind in SPOKEN:
                kept += entry_chars(entry)
            if kept >= keep_chars and entry.kind == "user":
                return entry.seq - 1 if entry.seq - 1 > after else None
        if len(page) < PAGE:
            return None
        before = page[0].seq


async def transcript_between(store: Store, conversation_id: int, after: int, upto: int,
                             budget_chars: int) -> tuple[str, int]:
    """The spoken entries in (after, upto] as text, oldest first, stopping at the budget:
    (text, the last position included)."""
    lines, used, last = [], 0, after
    while last < upto:
        page = await store.entries_page(conversation_id, after=last, limit=PAGE)
        if not page:
            break
        for entry in page:
            if entry.seq > upto:
                return "\n".join(lines), last
            if entry.kind in SPOKEN:
                line = _line(entry)
                if used + len(line) > budget_chars and lines:
                    return "\n".join(lines), last
                lines.append(line)
                used += len(line)
            last = entry.seq
    return "\n".join(lines), last


def _line(entry: Entry) -> str:
    who = {"user": entry.author or "user", "assistant": "assistant",
           "tool_result": f"tool {(entry.data or {}).get('name', '')}"}[entry.kind]
    calls = "".join(f" [calls {c['name']}({c['arguments']})]"
                    for c in (entry.data or {}).get("tool_calls", []))
    return f"{who}: {entry.text[:4000]}{calls}"


class Compact(TaskDef):
    kind = KIND

    def __init__(self, deps: AgentDeps):
        self.deps = deps

    async def step(self, ctx: TaskContext):
        store, config = self.deps.store, self.deps.config
        conv_id = ctx.task.conversation_id
        if ctx.phase == "":
            conversation = await store.get_conversation_by_id(conv_id)
            previous, after = await head_of(store, conversation)
            ratio = 1 / 3
            keep = int(config.compaction.keep_recent_tokens / ratio)
            cut = await choose_cut(store, conv_id, after=after, last_seq=conversation.last_seq,
                                   keep_chars=keep)
            if cut is None:
                return Done({"skipped": "nothing old enough to summarise"})
            budget = int((config.llm.context_window - config.llm.max_output_tokens) / ratio
                         * 0.8) - len(previous or "")
            text, upto = await transcript_between(store, conv_id, after, cut, budget)
            words = max(150, min(1500, config.llm.max_output_tokens // 2))
            user = (f"Previous summary:\n{previous}\n\n" if previous else "") + \
                f"New messages:\n{text}"
            request = Request(model=self.deps.client.model,
                              max_tokens=config.llm.max_output_tokens, messages=[
                                  Message(role="system",
                                          content=SUMMARY_PROMPT.format(words=words)),
                                  Message(role="user", content=user)])
            call = ctx.spawn("llm_call", {"request": request.model_dump(mode="json"),
                                          "quiet": True})
            return Wait("summarized", {"cut": upto, "after": after, "call": call})
        cp = ctx.checkpoint
        state, result, error = await store.task_outcome(cp["call"])
        result = result or {}
        if state != DONE or "response" not in result:
            return Fail(f"the summary failed: {result.get('error') or error}")
        summary = result["response"]["text"].strip()
        if not summary:
            return Fail("the model returned an empty summary")
        ctx.writes.append(conv_id, "compaction", summary, task_id=ctx.task.id, head=True,
                          data={"cut_seq": cp["cut"], "previous_cut": cp["after"]})
        return Done({"cut": cp["cut"]})


async def compaction_due(store: Store, conversation_id: int) -> bool:
    """Whether a new compaction may start: none running, and the last failures' backoff
    (doubling, up to an hour) has passed."""
    recent = await store.list_tasks(kind=KIND, conversation_id=conversation_id,
                                    newest_first=True, limit=8)
    if any(not t.terminal for t in recent):
        return False
    failures = 0
    for t in recent:
        if t.state != FAILED:
            break
        failures += 1
    if not failures:
        return True
    wait = min(BACKOFF_MAX, BACKOFF_BASE * 2 ** (failures - 1))
    return time.time() - recent[0].updated_at >= wait
