"""The compaction task: a workflow next to the turn that spawns it. It asks
bot/memory/compaction.py where to cut and for the transcript up to there, has the summary
written by an `llm_call` (quiet: no channel shows it), and appends it as the conversation's
new head (see that module for the rules). How much it keeps, how long the summary may be
and when a turn starts one are shares of the model's window (bot/memory/watermarks.py)."""

from bot.agent.context import (
    Assembled,
    offered_tools,
    prompt_with_facts,
    recall_room,
    tools_chars,
)
from bot.agent.deps import AgentDeps
from bot.agent.pinned import pin
from bot.config import Config
from bot.llm.types import Message, Request
from bot.memory.compaction import KIND, choose_cut, outside_between, transcript_between
from bot.memory.facts import facts_for
from bot.memory.transcript import head_of, tokens_per_char
from bot.memory.watermarks import Marks, marks
from bot.provenance import marked, outside_of
from bot.runtime import Checkpoint, Done, Fail, KindSpec, Phase, TaskContext, TaskDef, Wait
from store import DONE

__all__ = ["KIND", "Compact"]

SUMMARY_PROMPT = """You maintain the running summary of a long conversation between a user and
their assistant. Write a new summary that replaces the previous one (if given) and covers
the new messages. Keep: what the user asked for and decided, facts about them and their
world, open tasks, promises and commitments with dates, names, numbers and links that
may matter later. Drop small talk and tool output details. Write in the conversation's
language, as compact notes, under {words} words. End with one line saying that older
messages are stored and can be found with the search_history tool."""


def window_pressure(config: Config, assembled: Assembled) -> tuple[bool, bool]:
    """(full, filling) for a turn's request: full when it is over the limit or older
    entries after the summary did not fit (the turn waits for a summary), filling when its
    history is past the high-water mark (a summary is made in the background)."""
    m = marks(config.llm, config.compaction, assembled.fixed_tokens)
    full = assembled.estimated_tokens > m.limit or not assembled.window.complete
    return full, assembled.estimated_tokens - assembled.fixed_tokens > m.high


async def marks_for(deps: AgentDeps, conversation_id: int, ratio: float) -> Marks:
    """The marks for this conversation's requests, as `build_request` would make them."""
    config = deps.config
    facts = await facts_for(deps.store, conversation_id, config.compaction.facts_chars)
    fixed = len(prompt_with_facts(config, facts)) + tools_chars(
        offered_tools(config, deps.toolbox.specs()))
    # A turn's request keeps recall's room from the history (build_request): so must the
    # summary's, or what it keeps verbatim overflows the next turn's window at once.
    history = max(int((config.llm.window - config.llm.output_tokens) / ratio) - fixed, 2000)
    fixed += recall_room(history)
    return marks(config.llm, config.compaction, int(fixed * ratio) + 1)


class Summarizing(Checkpoint):
    cut: int  # the last entry the summary covers
    after: int | None  # the previous summary's cut
    call: str  # the LLM call writing it
    outside: str | None = None  # MARK: the outside text it is made from (bot/provenance.py)


class Compact(TaskDef):
    kind = KIND

    def __init__(self, deps: AgentDeps):
        self.deps = deps

    async def step(self, ctx: TaskContext):
        return await self.spec.run(self, ctx)

    async def summarize(self, ctx: TaskContext, _: None):
        store, config = self.deps.store, self.deps.config
        conv_id = ctx.task.conversation_id
        conversation = await store.get_conversation_by_id(conv_id)
        previous, after = await head_of(store, conversation)
        ratio = await tokens_per_char(store, conv_id)
        m = await marks_for(self.deps, conv_id, ratio)
        cut = await choose_cut(store, conv_id, after=after, last_seq=conversation.last_seq,
                               keep_chars=int(m.keep / ratio),
                               most_chars=int(max(m.keep, m.room // 2) / ratio))
        if cut is None:
            return Done({"skipped": "nothing old enough to summarise"})
        # The summary's request fits the window too: its reply, its instructions and
        # the previous summary first, then as much of the transcript as is left.
        reply = min(config.llm.output_tokens, 2 * m.summary)
        instructions = SUMMARY_PROMPT.format(words=m.summary_words)
        budget = int((config.llm.window - reply) / ratio * 0.85) \
            - len(instructions) - len(previous or "")
        text, upto = await transcript_between(store, conv_id, after, cut, max(budget, 500))
        user = (f"Previous summary:\n{previous}\n\n" if previous else "") + \
            f"New messages:\n{text}"
        request = Request(model=self.deps.config.llm.summary_model
                          or self.deps.client.model,
                          max_tokens=reply, messages=[
                              Message(role="system", content=instructions),
                              Message(role="user", content=user)])
        call = ctx.spawn("llm_call", {**pin(request), "quiet": True})
        # A summary of outside text is outside text (bot/provenance.py): it keeps the mark
        # of the previous summary or of what it covers.
        outside = outside_of(previous) or await outside_between(store, conv_id, after, upto)
        return Wait("summarized", Summarizing(cut=upto, after=after, call=call,
                                              outside=outside or None))

    async def summarized(self, ctx: TaskContext, cp: Summarizing):
        store, conv_id = self.deps.store, ctx.task.conversation_id
        state, result, error = await store.task_outcome(cp.call)
        result = result or {}
        if state != DONE or "response" not in result:
            return Fail(f"the summary failed: {result.get('error') or error}")
        summary = result["response"]["text"].strip()
        if not summary:
            return Fail("the model returned an empty summary")
        cut_off = result["response"].get("stop_reason") == "length"
        if cut_off:  # what was written is what there is: kept, never passed off as whole
            summary += "\n[…this summary was cut off at the model's length limit]"
        mark = marked(cp.outside)
        ctx.writes.append(conv_id, "compaction", summary, task_id=ctx.task.id, head=True,
                          data={"cut_seq": cp.cut, "previous_cut": cp.after, **mark})
        return Done({"cut": cp.cut, **({"cut_off": True} if cut_off else {})})

    # Its phases, in order: the checkpoint each starts from and the code that runs it.
    spec = KindSpec(KIND, version=1, phases=(
        Phase("", None, summarize),
        Phase("summarized", Summarizing, summarized),
    ))
