"""The compaction task: a workflow next to the turn that spawns it. It asks
bot/memory/compaction.py where to cut and for the transcript up to there, has the summary
written by an `llm_call` (quiet: no channel shows it), and appends it as the conversation's
new head (see that module for the rules)."""

from bot.agent.deps import AgentDeps
from bot.agent.pinned import pin
from bot.llm.types import Message, Request
from bot.memory.compaction import KIND, choose_cut, outside_between, transcript_between
from bot.memory.transcript import head_of, tokens_per_char
from bot.provenance import MARK, marked, outside_of
from bot.runtime import Done, Fail, TaskContext, TaskDef, Wait
from store import DONE

__all__ = ["KIND", "Compact"]

SUMMARY_PROMPT = """You maintain the running summary of a long conversation between a user and
their assistant. Write a new summary that replaces the previous one (if given) and covers
the new messages. Keep: what the user asked for and decided, facts about them and their
world, open tasks, promises and commitments with dates, names, numbers and links that
may matter later. Drop small talk and tool output details. Write in the conversation's
language, as compact notes, under {words} words. End with one line saying that older
messages are stored and can be found with the search_history tool."""


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
            ratio = await tokens_per_char(store, conv_id)
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
            request = Request(model=self.deps.config.llm.summary_model
                              or self.deps.client.model,
                              max_tokens=config.llm.max_output_tokens, messages=[
                                  Message(role="system",
                                          content=SUMMARY_PROMPT.format(words=words)),
                                  Message(role="user", content=user)])
            call = ctx.spawn("llm_call", {**pin(request), "quiet": True})
            # A summary of outside text is outside text (bot/provenance.py): it keeps the mark
            # of the previous summary or of what it covers.
            outside = outside_of(previous) or await outside_between(store, conv_id, after, upto)
            return Wait("summarized", {"cut": upto, "after": after, "call": call,
                                       **marked(outside)})
        cp = ctx.checkpoint
        state, result, error = await store.task_outcome(cp["call"])
        result = result or {}
        if state != DONE or "response" not in result:
            return Fail(f"the summary failed: {result.get('error') or error}")
        summary = result["response"]["text"].strip()
        if not summary:
            return Fail("the model returned an empty summary")
        mark = marked(cp.get(MARK))
        ctx.writes.append(conv_id, "compaction", summary, task_id=ctx.task.id, head=True,
                          data={"cut_seq": cp["cut"], "previous_cut": cp["after"], **mark})
        return Done({"cut": cp["cut"]})
