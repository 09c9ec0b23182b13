"""An agent turn: a workflow over a checkpoint.

    ""           wait for older turns of the conversation; skip if already answered
                 (a turn whose message was deleted before this phase ran is withdrawn
                 instead: done without running, see `inbox.withdraw_message`)
    llm          assemble the context, spawn an llm_call, wait for it
    after_llm    record the reply; check its tool calls (`call_check`: one that may not
                 run is answered with its error), spawn one tool_call per call that may
                 (they run in parallel) and wait, or spawn the delivery of the final answer
                 (said to be cut off if the model stopped at its length limit) and wait
    after_tools  record the tool results in call order and go on as `llm` does, in the
                 same commit
    delivered    done

Every phase commits with its writes, so a crash anywhere resumes at the last phase; the
children (LLM calls, tools, deliveries) carry their own replay policies. The phases are
the table `Turn.spec` (bot/runtime/kinds.py), each with its checkpoint's type
(bot/agent/turn_checkpoints.py).
"""

import time

from bot.agent import budget
from bot.agent.apology import apology
from bot.agent.approval import KIND as APPROVAL
from bot.agent.call_check import check_calls
from bot.agent.compact import KIND as COMPACT
from bot.agent.compact import window_pressure
from bot.agent.context import assemble
from bot.agent.deps import AgentDeps
from bot.agent.inbox import ANSWER_KEY, ASKER, TIMEZONE, TURN
from bot.agent.pinned import pin
from bot.agent.tool_result import tool_outcome
from bot.agent.turn_checkpoints import AfterLLM, AfterTools, Delivered, NotRun, TurnCheckpoint
from bot.llm.types import Response, ToolCall
from bot.memory.compaction import compaction_due
from bot.provenance import MARK, first, marked, of_entry, own_words
from bot.runtime import Done, Sleep, TaskContext, TaskDef, Wait
from bot.runtime.kinds import KindSpec, Phase, Refused
from bot.tools.permissions import READS_OUTSIDE, Asking, approval_needed, recipients
from store import DONE

# Seconds a queued turn sleeps at most. Only a safety net: the older turn's last commit wakes
# it (race-free, see store/commit.py). Longer than `steward resume` waits for work due soon,
# so a queue behind a turn riding out an outage does not keep `resume` from exiting.
WAIT_FOR_OLDER_TURN = 600.0
# After a reply the model stopped at its length limit (the output cap, or a server whose
# context filled): it is not the whole answer, and the person must not take it for one.
CUT_OFF = ("[…the answer was cut off here: the model stopped at its length limit. Ask me "
           "to go on, or for a shorter answer.]")
# Said with an answer the model wrote without its tools, because with them the request did
# not fit the server's context window.
WITHOUT_TOOLS = ("(This conversation is too long for the model's context window with my "
                 "tools, so this answer was written without them: nothing was remembered, "
                 "scheduled or looked up for it.)")


class Turn(TaskDef):
    kind = TURN

    def __init__(self, deps: AgentDeps):
        self.deps = deps

    async def step(self, ctx: TaskContext):
        return await self.spec.run(self, ctx)

    @property
    def store(self):
        return self.deps.store

    async def start(self, ctx: TaskContext, _: TurnCheckpoint | None):
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
        return await self.llm(ctx, TurnCheckpoint(upto=upto, round=0))

    async def llm(self, ctx: TaskContext, cp: TurnCheckpoint, pending: list = ()):
        """`pending`: the entries this step writes before the request (the tool results),
        which the request holds as if they had landed."""
        capped, cp = await self._spending_caps(ctx, cp)
        if capped is not None:
            return capped
        deps, conv_id = self.deps, ctx.task.conversation_id
        config = deps.config
        tools = deps.toolbox.specs() \
            if cp.round < config.agent.max_tool_rounds and not cp.without_tools else []
        # The asker's zone (their Slack profile's), else the configured one: recall reads a
        # time phrase ("last spring") and dates its hits there.
        assembled = await assemble(self.store, config, conv_id, tools=tools,
                                   model=deps.client.model, upto=cp.upto,
                                   cache=deps.context_cache,
                                   timezone=ctx.inputs.get(TIMEZONE), pending=pending)
        if config.compaction.enabled:
            full, near = window_pressure(config, assembled)
            if (full or near) and await compaction_due(self.store, conv_id):
                if full and not cp.compacted:
                    # At the limit: wait for the summary (once per turn), then assemble again.
                    ctx.spawn(COMPACT, {"reason": "window full"})
                    return Wait("llm", cp.but(compacted=True))
                # Approaching it: summarise in the background while this turn goes on.
                ctx.writes.spawn(COMPACT, {"reason": "window filling"}, conversation_id=conv_id)
        # Where the answer goes rides along, so a channel can show the streamed text.
        llm_task = ctx.spawn("llm_call", {**pin(assembled.request),
                                          "channel": ctx.inputs.get("channel", "cli"),
                                          "reply_to": ctx.inputs.get("reply_to", {}),
                                          "answer": ctx.inputs.get(ANSWER_KEY) or ctx.task.id})
        deps.pinned.put(llm_task, assembled.request)
        # Outside text in the request (bot/provenance.py) stays with the turn from now on.
        outside = cp.read_outside or assembled.outside
        return Wait("after_llm", AfterLLM.model_validate(
            {**cp.model_dump(), "llm_task": llm_task, "read_outside": outside or None}))

    async def _spending_caps(self, ctx: TaskContext, cp: TurnCheckpoint):
        """At a spending cap: the notice, instead of calling the model. Near one: a note
        for the answer, once per cap and period (bot/agent/budget.py). Returns (the
        notice's outcome or None, the checkpoint to go on with)."""
        caps = self.deps.config.limits
        if not caps.limited:
            return None, cp
        owner = (await self.store.known_conversation(ctx.task.conversation_id)).owner
        verdict = await budget.check(self.store, self.deps.config, owner)
        if verdict.over is not None:
            notice = budget.over_notice(verdict.over, caps.currency)
            if verdict.over.calls and verdict.over.repeated:
                # A flood past the hourly rate was told once: the rest are recorded as
                # answered, not sent (a thousand threads must not make a thousand posts).
                ctx.writes.append(ctx.task.conversation_id, "assistant", notice,
                                  task_id=ctx.task.id, data={
                                      "final": True, "answers_upto": cp.upto,
                                      "error": True, "not_sent": "rate"})
                return await self._finish(ctx, {"text": notice, "delivery": None}), cp
            return self._answer(ctx, cp, notice), cp
        if verdict.near is not None and cp.note is None \
                and await budget.claim_note(self.store, verdict.near, owner):
            cp = cp.but(note=budget.near_note(verdict.near, caps.currency))
        return None, cp

    async def after_llm(self, ctx: TaskContext, cp: AfterLLM):
        conv_id = ctx.task.conversation_id
        state, result, error = await self.store.task_outcome(cp.llm_task)
        result = result or {}
        if result.get("error_type") == "ContextOverflow" and not cp.overflow_retried:
            # The provider says it does not fit after all: compact, then try once more.
            ctx.spawn(COMPACT, {"reason": "context overflow"})
            return Wait("llm", cp.but(overflow_retried=True, compacted=True))
        if result.get("error_type") == "ContextOverflow" and not cp.without_tools \
                and self.deps.toolbox.specs():
            # Still too big: on a small local server the tools' schemas alone can take most
            # of the window. Once more without them, rather than no answer at all.
            return await self.llm(ctx, cp.but(without_tools=True))
        if state != DONE or "error" in result:
            failure = (await self.store.get_task(cp.llm_task)).failure
            return self._answer(ctx, cp, apology(result, error, state, failure=failure),
                                error=True)
        response = Response.model_validate(result["response"])
        if response.notes:  # told with the answer, once each
            cp = cp.but(notes=[*cp.notes, *(n for n in response.notes if n not in cp.notes)])
        if not response.tool_calls:
            text = response.text
            if response.stop_reason == "length":  # never shown as if it were complete
                text = f"{text.rstrip()}\n\n{CUT_OFF}" if text.strip() else CUT_OFF
            return self._answer(ctx, cp, text)
        # Checked before anything runs (bot/agent/call_check.py): a call that may not run
        # is answered with its error, and stored in a form any server reads back.
        checked = check_calls(response, self.deps.toolbox,
                              most=self.deps.config.agent.max_tool_calls)
        calls = [c.call.model_dump(mode="json") for c in checked]
        mark = marked(cp.read_outside)
        ctx.writes.append(conv_id, "assistant", response.text, task_id=ctx.task.id,
                          data={"tool_calls": calls, "answers_upto": cp.upto, **mark})
        # Each call's idempotency key (for `keyed` tools) is derived from the turn, the
        # round and the call's place in it: the same on every re-run, unique in the turn
        # even when a model repeats call ids across rounds. A call that needs the person's
        # yes first waits for it as an approval (which then spawns it, with the same key).
        asking = await self._asking(ctx, cp)
        mark = marked(asking.read_outside)  # what they store
        tool_tasks: list = []
        for n, verdict in enumerate(checked):
            if verdict.problem is not None:  # nothing runs: its result is the error
                tool_tasks.append(NotRun(call=calls[n], error=verdict.problem))
                continue
            c = verdict.call
            key = f"{ctx.task.id}.{cp.round}.{n}"
            summary = await self._approval(c, asking)
            if summary is None:
                tool_tasks.append(ctx.spawn("tool_call", {"call": calls[n], **mark},
                                            idem_key=key))
                continue
            tool_tasks.append(ctx.spawn(APPROVAL, {
                "call": calls[n], "idem_key": key, "summary": summary,
                "channel": ctx.inputs.get("channel", "cli"),
                "reply_to": ctx.inputs.get("reply_to", {}), "who": asking.who,
                "expires_at": time.time() + 60 * self.deps.config.agent.approval_expiry_minutes,
                **mark}))
        waiting = AfterTools.model_validate(
            {**cp.model_dump(), "tool_tasks": tool_tasks, "round": cp.round + 1})
        if all(isinstance(t, NotRun) for t in tool_tasks):  # none runs: nothing to wait for
            return await self.after_tools(ctx, waiting)
        return Wait("after_tools", waiting)

    async def _asking(self, ctx: TaskContext, cp: TurnCheckpoint) -> Asking:
        conv_id = ctx.task.conversation_id
        conversation = await self.store.known_conversation(conv_id)
        # The person who asked (in a shared thread not always the one who started it);
        # turns stored before it was an input fall back to the conversation's owner.
        who = ctx.inputs.get(ASKER) or conversation.owner
        said = await self._answered(ctx, cp.upto)
        channel = self.deps.channels.get(ctx.inputs.get("channel") or "")
        return Asking(recipients(self.deps),
                      asker=channel.asker_address(who) if channel is not None else None,
                      read_outside=cp.read_outside
                      or first(of_entry(e) for e in said),
                      who=who or "local", own_words=own_words(said))

    async def _answered(self, ctx: TaskContext, upto: int) -> list:
        """The messages this turn answers: its own and the follow-ups it took in, up to
        `upto` (what the person wrote, for the rules in bot.tools.permissions)."""
        conv_id = ctx.task.conversation_id
        mine = await self.store.entry_of_task(conv_id, ctx.task.id)
        if mine is None:
            return []
        return [e for e in await self.store.entries_page(conv_id, after=mine.seq - 1, limit=50)
                if e.seq <= upto and e.kind == "user"]

    async def _approval(self, call: ToolCall, asking: Asking) -> str | None:
        tool = self.deps.toolbox.get(call.name)
        if tool is None:
            return None  # answered with an error, nothing runs
        # The tool's own rule first: it says what exactly would happen (whom it mails).
        return await tool.approval(asking, call.arguments) or approval_needed(
            tool, call.arguments, asking, config=self.deps.config,
            custom=call.name in self.deps.toolbox.custom)

    async def after_tools(self, ctx: TaskContext, waited: AfterTools):
        turn_mark = waited.read_outside  # what this turn's own calls were made from
        read_outside = turn_mark
        for task_id in waited.tool_tasks:
            if isinstance(task_id, NotRun):  # a call that was not run (call_check)
                call = ToolCall.model_validate(task_id.call)
                ctx.writes.append(ctx.task.conversation_id, "tool_result", task_id.error,
                                  data={"tool_call_id": call.id, "name": call.name,
                                        "is_error": True, **marked(turn_mark)},
                                  task_id=ctx.task.id)
                continue
            task = await self.store.get_task(task_id)
            call = ToolCall.model_validate(task.inputs["call"])
            content, is_error = tool_outcome(task)
            tool = self.deps.toolbox.get(call.name)
            outside = tool is not None and READS_OUTSIDE in tool.touches and not is_error
            data = {"tool_call_id": call.id, "name": call.name, "is_error": is_error}
            if outside:  # shown to the model as data (context.UNTRUSTED), and remembered:
                data["untrusted"] = True  # sending or scheduling now needs approval
                read_outside = read_outside or call.name
            shown = (task.result or {}).get(MARK) if isinstance(task.result, dict) else None
            if why := (call.name if outside else None) or shown or turn_mark:
                data[MARK] = why  # what stored outside text it shows, or was made from
                read_outside = read_outside or why
            ctx.writes.append(ctx.task.conversation_id, "tool_result", content, data=data,
                              task_id=ctx.task.id)
        # Straight on to the next LLM call, in the commit that records the results: the
        # request is built as if they had landed, and lands with them or not at all.
        cp = TurnCheckpoint.model_validate({**waited.model_dump(exclude={"tool_tasks"}),
                                            "read_outside": read_outside})
        return await self.llm(ctx, cp, pending=list(ctx.writes.entries))

    async def poisoned(self, ctx: TaskContext, reason: str):
        """Working on this message keeps killing the process: the person is told, once (the
        answer's delivery is keyed by the turn), and the conversation's queue moves on."""
        return await self._stopped(ctx, "Sorry, I had to stop working on this message: "
                                   f"Steward crashed each time it tried ({reason}).")

    async def refused(self, ctx: TaskContext, reason: str):
        """This build cannot read where the turn got to (a newer build's checkpoint): the
        person is told, and the conversation's queue moves on."""
        return await self._stopped(ctx, "Sorry, I had to stop working on this message: it "
                                   f"was left by another version of Steward ({reason}).")

    async def _stopped(self, ctx: TaskContext, text: str):
        try:
            _, cp = self.spec.read(ctx.phase, ctx.checkpoint)
        except Refused:
            cp = None
        if cp is None or not cp.upto:
            conversation = await self.store.get_conversation_by_id(ctx.task.conversation_id)
            cp = TurnCheckpoint(upto=conversation.last_seq, round=0)
        return self.spec.written(self._answer(ctx, cp, text, error=True))

    async def delivered(self, ctx: TaskContext, cp: Delivered):
        return await self._finish(ctx, {"text": cp.answer, "delivery": cp.delivery})

    def _answer(self, ctx: TaskContext, cp: TurnCheckpoint, text: str, *,
                error: bool = False):
        """Record the final answer and hand it to a delivery (its key is derived from the
        turn, so even a repeated phase cannot make a second one)."""
        conv_id = ctx.task.conversation_id
        for said in cp.notes:  # what the person sent that the model did not see
            text = f"{text}\n\n{said}"
        if cp.without_tools and not error:
            text = f"{text}\n\n{WITHOUT_TOOLS}"
        if cp.note:  # near a spending cap: said once, with this answer
            text = f"{text}\n\n{cp.note}"
        mark = marked(cp.read_outside)
        ctx.writes.append(conv_id, "assistant", text, task_id=ctx.task.id,
                          data={"final": True, "answers_upto": cp.upto, "error": error,
                                **mark})
        # Keyed by the message it answers where there is one (inbox.answer_key), else by
        # the turn: never two answers for one message, in this home or a restored one.
        key = ctx.inputs.get(ANSWER_KEY) or ctx.task.id  # as the streamed text's (llm_call)
        delivery = ctx.writes.deliver(
            "deliver", {"channel": ctx.inputs.get("channel", "cli"), "text": text,
                        "reply_to": ctx.inputs.get("reply_to", {})},
            key=f"{key}.answer", parent_id=ctx.task.id, conversation_id=conv_id)
        return Wait("delivered", Delivered.model_validate(
            {**cp.model_dump(), "answer": text, "delivery": delivery}))

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

    # The phases, in the order a turn usually runs them: the checkpoint each starts from
    # (bot/agent/turn_checkpoints.py) and the code that runs it. Version 1: as 7338092 wrote.
    # The first phase starts from nothing, or from what a failed try of the first LLM call
    # left under 7338092 (which it does not need).
    spec = KindSpec(TURN, version=1, phases=(
        Phase("", TurnCheckpoint, start, or_none=True),
        Phase("llm", TurnCheckpoint, llm),
        Phase("after_llm", AfterLLM, after_llm),
        Phase("after_tools", AfterTools, after_tools),
        Phase("delivered", Delivered, delivered),
    ))
