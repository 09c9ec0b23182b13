"""Delivering an answer to its channel. The key was reserved when the answer was stored;
after a crash mid-send the channel is asked whether it already has the message (Slack
history, the Sent folder) before anything is sent again."""

from bot.agent.deps import AgentDeps
from bot.channels import Outbound
from bot.runtime import Effect, NotPerformed, Policy, TaskContext


class Deliver(Effect):
    kind = "deliver"
    policy = Policy.UNSAFE  # a message shown twice is exactly what must not happen

    def __init__(self, deps: AgentDeps):
        self.deps = deps

    async def _target(self, ctx: TaskContext):
        name = ctx.inputs["channel"]
        channel = self.deps.channels.get(name)
        if channel is None:
            raise NotPerformed(f"channel {name!r} is not enabled in this process")
        conversation = await self.deps.store.get_conversation_by_id(ctx.task.conversation_id)
        return channel, Outbound(key=ctx.idem_key, conversation_key=conversation.key,
                                 conversation_id=conversation.id, text=ctx.inputs["text"],
                                 reply_to=ctx.inputs.get("reply_to", {}))

    def can_reconcile(self, ctx: TaskContext) -> bool:
        return True

    async def reconcile(self, ctx: TaskContext):
        channel, message = await self._target(ctx)
        found = await channel.find(message)
        return found is not None, found

    async def perform(self, ctx: TaskContext):
        channel, message = await self._target(ctx)
        return await channel.send(message)
