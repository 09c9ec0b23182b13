"""A tool call as a task, with the replay policy the tool declared (unknown tools are
answered with an error, which is safe to repeat)."""

from bot.agent.deps import AgentDeps
from bot.agent.inbox import TIMEZONE
from bot.llm.types import ToolCall
from bot.provenance import MARK
from bot.runtime import Effect, Policy, TaskContext, effect_spec
from bot.runtime.killpoints import kill_point
from bot.tools import ToolContext, ToolResult, known_timezone
from bot.tools.netguard import NetGuard
from bot.tools.permissions import recipients
from store import NotFound, Task


class ToolCallTask(Effect):
    kind = "tool_call"
    spec = effect_spec(kind)

    def __init__(self, deps: AgentDeps):
        self.deps = deps
        self._netguard = NetGuard(deps.config.agent.http_allow)  # [agent] http_allow

    def _call(self, ctx: TaskContext):
        call = ToolCall.model_validate(ctx.inputs["call"])
        return call, self.deps.toolbox.get(call.name)

    def policy_for(self, ctx: TaskContext) -> Policy:
        call, tool = self._call(ctx)
        return tool.policy_for(call.arguments) if tool else Policy.SAFE

    def can_reconcile(self, ctx: TaskContext) -> bool:
        _, tool = self._call(ctx)
        return tool is not None and tool.reconcile_fn is not None

    async def _tool_context(self, ctx: TaskContext) -> ToolContext:
        async def save_partial(value):
            await ctx.save_checkpoint({**(ctx.checkpoint or {}), "partial": value})

        origin, key, zone, asked_at = {}, None, None, None
        if ctx.task.parent_id:
            turn = await self.deps.store.get_task(ctx.task.parent_id)
            origin = {"channel": turn.inputs.get("channel"),
                      "reply_to": turn.inputs.get("reply_to", {})}
            zone = await self._zone_of(turn)
            asked_at = turn.created_at
        if ctx.task.conversation_id is not None:
            key = (await self.deps.store.known_conversation(ctx.task.conversation_id)).key
        # The key the turn reserved for this call (`<turn>.<round>.<n>`); a task spawned
        # before keys were given falls back to its own id, which is as stable.
        return ToolContext(store=self.deps.store, task_id=ctx.task.id,
                           conversation_id=ctx.task.conversation_id, conversation_key=key,
                           idem_key=ctx.idem_key or ctx.task.id, writes=ctx.writes,
                           http=self.deps.http,
                           timezone=zone or self.deps.config.agent.timezone,
                           save_partial=save_partial, origin=origin,
                           recipients=recipients(self.deps),
                           approved=bool(ctx.inputs.get("approved")),
                           netguard=self._netguard, channels=self.deps.channels,
                           outside=ctx.inputs.get(MARK), asked_at=asked_at)

    async def _zone_of(self, turn: Task) -> str | None:
        """The zone of the person the turn answers: stored with their message (a Slack
        profile's), or, for a schedule's occurrence, the schedule's own; None when neither
        is known (email, the terminal): the configured zone then."""
        zone = known_timezone(turn.inputs.get(TIMEZONE))
        if zone is None and turn.inputs.get("schedule"):
            try:
                schedule = await self.deps.store.get_schedule(turn.inputs["schedule"])
            except NotFound:
                return None
            zone = known_timezone(schedule.timezone)
        return zone

    async def reconcile(self, ctx: TaskContext):
        call, tool = self._call(ctx)
        found, result = await tool.reconcile(await self._tool_context(ctx), call.arguments)
        return found, (result.to_json() if found and result is not None else None)

    async def perform(self, ctx: TaskContext):
        call, tool = self._call(ctx)
        if tool is None:
            return ToolResult(f"error: there is no tool named {call.name!r}", True).to_json()
        result = await tool.run(await self._tool_context(ctx), call.arguments)
        kill_point("after-tool", call.name)
        return result.to_json()
