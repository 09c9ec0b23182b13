"""An agent turn: a workflow over a checkpoint.

    ""           wait for older turns of the conversation; skip if already answered
                 (a turn whose message was deleted before this phase ran is withdrawn
                 instead: done without running, see `inbox.withdraw_message`)
    llm          assemble the context, spawn an llm_call, wait for it
    after_llm    record the reply; spawn one tool_call per call (they run in parallel) and
                 wait, or spawn the delivery of the final answer and wait
    after_tools  record the tool results in call order, back to `llm`
    delivered    done

Every phase commits with its writes, so a crash anywhere resumes at the last phase; the
children (LLM calls, tools, deliveries) carry their own replay policies.
"""

from bot.agent.context import build_request
from bot.agent.deps import AgentDeps
from bot.agent.inbox import TURN
from bot.llm.types import Response, ToolCall
from bot.memory.compaction import KIND as COMPACT
from bot.memory.compaction import compaction_due
from bot.memory.facts import facts_for
from bot.memory.recall import recall
from bot.runtime import Continue, Done, Sleep, TaskContext, TaskDef, Wait
from store import DONE, INTERRUPTED, Task

# Seconds a queued turn sleeps at most. Only a safety net: the older turn's last commit wakes
# it (race-free, see store/commit.py). Longer than `steward resume` waits for work due soon,
# so a queue behind a turn riding out an outage does not keep `resume` from exiting.
WAIT_FOR_OLDER_TURN = 600.0

INTERRUPTED_NOTE = ("error: this tool call was interrupted (Steward stopped while it ran) and "
                    "was not repeated, because it may already have taken effect.")


class Turn(TaskDef):
    kind = TURN

    def __init__(self, deps: AgentDeps):
        self.deps = deps

    async def step(self, ctx: TaskContext):
        return await getattr(self, f"_phase_{ctx.phase or 'start'}")(ctx)

    @property
    def store(self):
        return self.deps.store

    async def _phase_start(self, ctx: TaskContext):
        conv_id = ctx.task.conversation_id
        older = await self.store.list_tasks(kind=TURN, conversation_id=conv_id, active=True,
                                            before_id=ctx.task.id, limit=1)
        if older:  # follow-ups keep their order: one turn at a time per conversation
            return Sleep(WAIT_FOR_OLDER_TURN, "", None, until_settled=(older[0].id,))
        mine = await self.store.entry_of_task(conv_id, ctx.task.id)
        if mine is not None:
            # Did an older turn take this message in and answer it? Its answer comes after
            # the message, however many tool rounds later: page through to the end.
            after = mine.seq
            while later := await self.store.entries_page(conv_id, after=after, limit=200):
                for e in later:
                    if e.kind == "assistant" and \
                            (e.data or {}).get("answers_upto", 0) >= mine.seq:
                        return await self._finish(ctx, {"covered_by": e.seq})
                after = later[-1].seq
        upto = (await self.store.get_conversation_by_id(conv_id)).last_seq
        # Straight on to the first LLM call: one commit instead of two.
        ctx.checkpoint = {"upto": upto, "round": 0}
        return await self._phase_llm(ctx)

    async def _phase_llm(self, ctx: TaskContext):
        cp = ctx.checkpoint
        deps, conv_id = self.deps, ctx.task.conversation_id
        config = deps.config
        tools = deps.toolbox.specs() if cp["round"] < config.agent.max_tool_rounds else []
        assembled = await build_request(
            self.store, config, conv_id, tools=tools, model=deps.client.model,
            upto=cp["upto"], cache=deps.context_cache,
            facts=await facts_for(self.store, conv_id, config.compaction.facts_chars),
            recall=lambda conversation, said, seen: recall(self.store, conversation, said,
                                                           in_window=seen))
        if config.compaction.enabled:
            limit = config.llm.context_window - config.llm.max_output_tokens
            full = assembled.estimated_tokens > limit or not assembled.window.complete
            near = assembled.estimated_tokens > limit - config.compaction.reserve_tokens
            if (full or near) and await compaction_due(self.store, conv_id):
                if full and not cp.get("compacted"):
                    # At the limit: wait for the summary (once per turn), then assemble again.
                    ctx.spawn(COMPACT, {"reason": "window full"})
                    return Wait("llm", {**cp, "compacted": True})
                # Approaching it: summarise in the background while this turn goes on.
                ctx.writes.spawn(COMPACT, {"reason": "window filling"}, conversation_id=conv_id)
        llm_task = ctx.spawn("llm_call", {"request": assembled.request.model_dump(mode="json")})
        return Wait("after_llm", {**cp, "llm_task": llm_task})

    async def _phase_after_llm(self, ctx: TaskContext):
        cp = ctx.checkpoint
        conv_id = ctx.task.conversation_id
        state, result, error = await self.store.task_outcome(cp["llm_task"])
        result = result or {}
        if result.get("error_type") == "ContextOverflow" and not cp.get("overflow_retried"):
            # The provider says it does not fit after all: compact, then try once more.
            ctx.spawn(COMPACT, {"reason": "context overflow"})
            return Wait("llm", {**cp, "overflow_retried": True, "compacted": True})
        if state != DONE or "error" in result:
            problem = result.get("error") or error or state
            text = f"Sorry, I could not get an answer from the model: {problem}"
            if result.get("retry_after"):  # a rate limit longer than retries wait out
                minutes = max(1, round(result["retry_after"] / 60))
                text += f" (the provider asks me to wait about {minutes} minute" \
                        f"{'s' if minutes > 1 else ''}; please ask again then)"
            return self._answer(ctx, text, error=True)
        response = Response.model_validate(result["response"])
        if not response.tool_calls:
            return self._answer(ctx, response.text)
        calls = [c.model_dump(mode="json") for c in response.tool_calls]
        ctx.writes.append(conv_id, "assistant", response.text, task_id=ctx.task.id,
                          data={"tool_calls": calls, "answers_upto": cp["upto"]})
        # Each call's idempotency key (for `keyed` tools) is derived from the turn, the
        # round and the call's place in it: the same on every re-run, unique in the turn
        # even when a model repeats call ids across rounds.
        tool_tasks = [ctx.spawn("tool_call", {"call": c},
                                idem_key=f"{ctx.task.id}.{cp['round']}.{n}")
                      for n, c in enumerate(calls)]
        return Wait("after_tools", {**cp, "tool_tasks": tool_tasks, "round": cp["round"] + 1})

    async def _phase_after_tools(self, ctx: TaskContext):
        cp = ctx.checkpoint
        for task_id in cp["tool_tasks"]:
            task = await self.store.get_task(task_id)
            call = ToolCall.model_validate(task.inputs["call"])
            content, is_error = tool_outcome(task)
            ctx.writes.append(ctx.task.conversation_id, "tool_result", content,
                              data={"tool_call_id": call.id, "name": call.name,
                                    "is_error": is_error}, task_id=ctx.task.id)
        return Continue("llm", {k: v for k, v in cp.items() if k != "tool_tasks"})

    async def _phase_delivered(self, ctx: TaskContext):
        return await self._finish(ctx, {"text": ctx.checkpoint["answer"],
                                  "delivery": ctx.checkpoint["delivery"]})

    def _answer(self, ctx: TaskContext, text: str, *, error: bool = False):
        """Record the final answer and hand it to a delivery (its key is derived from the
        turn, so even a repeated phase cannot make a second one)."""
        cp = ctx.checkpoint
        conv_id = ctx.task.conversation_id
        ctx.writes.append(conv_id, "assistant", text, task_id=ctx.task.id,
                          data={"final": True, "answers_upto": cp["upto"], "error": error})
        delivery = ctx.writes.deliver(
            "deliver", {"channel": ctx.inputs.get("channel", "cli"), "text": text,
                        "reply_to": ctx.inputs.get("reply_to", {})},
            key=f"{ctx.task.id}.answer", parent_id=ctx.task.id, conversation_id=conv_id)
        return Wait("delivered", {**cp, "answer": text, "delivery": delivery})

    async def _finish(self, ctx: TaskContext, result: dict):
        """Done; the next queued turn of this conversation may start now. The one after it
        is woken too: the next may be withdrawn (its message deleted, see
        `inbox.withdraw_message`) between this read and this commit, and the one behind it
        would then sleep out its whole wait; woken early, it just sleeps again."""
        nxt = await self.store.list_tasks(kind=TURN, conversation_id=ctx.task.conversation_id,
                                          active=True, after_id=ctx.task.id, limit=2)
        for queued in nxt:
            ctx.writes.wake(queued.id)
        return Done(result)


def tool_outcome(task: Task) -> tuple[str, bool]:
    """What the model is told about a finished tool task."""
    if task.state == DONE and isinstance(task.result, dict) and "content" in task.result:
        return task.result["content"], bool(task.result.get("is_error"))
    if task.state == INTERRUPTED:
        partial = (task.result or {}).get("partial")
        return INTERRUPTED_NOTE + (f" Partial output: {partial}" if partial else ""), True
    return f"error: the tool call failed: {task.error or task.state}", True
