"""Delivering an answer to its channel. The key was reserved when the answer was stored;
after a crash mid-send the channel is asked whether it already has the message (Slack
history, the Sent folder) before anything is sent again.

An answer whose question was taken back (deleted) before it was shown is not shown, on any
channel: the delivery is recorded as skipped, and a channel that streamed part of it takes
that back (`retract`). The connector says where it records such a deletion
(`withdrawal_ref`), as history of the conversation (bot.agent.inbox.withdraw_message)."""

import logging
import time
from typing import Any

from bot.agent.deps import AgentDeps
from bot.channels import Outbound
from bot.runtime import Done, Effect, NotPerformed, Policy, TaskContext, effect_spec

log = logging.getLogger(__name__)

SKIPPED = "the question was deleted"
COVERS_TAIL = 60  # transcript entries read to find the messages an answer covered


class Deliver(Effect):
    kind = "deliver"
    spec = effect_spec(kind)
    policy = Policy.UNSAFE  # a message shown twice is exactly what must not happen

    def __init__(self, deps: AgentDeps):
        self.deps = deps

    async def _target(self, ctx: TaskContext):
        name = ctx.inputs["channel"]
        channel = self.deps.channels.get(name)
        if channel is None:
            raise NotPerformed(f"channel {name!r} is not enabled in this process")
        store = self.deps.store
        conversation = await store.known_conversation(ctx.task.conversation_id)
        reply_to = ctx.inputs.get("reply_to", {})
        ref = channel.withdrawal_ref(reply_to)
        withdrawn = ref is not None and \
            await store.submission_state(f"{name}:history", ref) is not None
        covers: tuple[dict[str, Any], ...] = ()
        if ctx.idem_key.endswith(".answer") and ctx.task.parent_id:
            covers = await self._covered(conversation.id, ctx.task.parent_id)
        return channel, Outbound(key=ctx.idem_key, conversation_key=conversation.key,
                                 conversation_id=conversation.id, text=ctx.inputs["text"],
                                 reply_to=reply_to, approval=ctx.inputs.get("approval"),
                                 withdrawn=withdrawn, covers=covers)

    async def _covered(self, conversation_id: int, turn: str) -> tuple[dict[str, Any], ...]:
        """The data of the user messages the turn's answer covered: those after the answer
        before it, up to the position its final entry says it answered."""
        page = await self.deps.store.entries_page(conversation_id, limit=COVERS_TAIL)
        upto = lower = None
        for e in reversed(page):
            final = e.kind == "assistant" and (e.data or {}).get("final")
            if final and upto is None and e.task_id == turn:
                upto = (e.data or {}).get("answers_upto")
            elif final and upto is not None:
                lower = (e.data or {}).get("answers_upto")
                break
        if upto is None:
            return ()
        floor = lower or 0
        said = [e for e in page if e.kind == "user" and floor < e.seq <= upto]
        asked = [e for e in said if not (e.data or {}).get("history")]
        # A message of the asker's taken in as the thread's history (its own event came
        # late, and is then passed over as seen) was answered by this answer too: it says
        # so, or a home restored from a backup, given that late event, answers it again.
        # Not one of another conversation's, shown as context (the DM message a Slack
        # thread hangs under): it is answered there, and the claim would lose it.
        authors = {e.author for e in asked if e.author}
        return tuple(e.data or {} for e in said if e in asked or (
            e.author in authors and not (e.data or {}).get("other_conversation")))

    def can_reconcile(self, ctx: TaskContext) -> bool:
        return True

    async def step(self, ctx: TaskContext):
        # A home restored from a backup: its predecessor may have shown this answer after
        # the snapshot. Until `reconcile_until` every delivery is taken as one that may have
        # happened: the channel is asked first, as after a crash (bot/app/restore.py).
        if time.time() < self.deps.reconcile_until:
            happened, result = await self.reconcile(ctx)
            if happened:
                return Done(result, self.settled_inputs(ctx))
        return await super().step(ctx)

    async def reconcile(self, ctx: TaskContext):
        channel, message = await self._target(ctx)
        found = await channel.find(message)
        log.info("delivery %s (%s): %s", message.key, channel.name,
                 "already shown: not sent again" if found is not None else "not shown yet")
        return found is not None, found

    async def perform(self, ctx: TaskContext):
        channel, message = await self._target(ctx)
        if message.withdrawn:
            taken_back = await channel.retract(message)
            return {"skipped": SKIPPED, **(taken_back or {})}
        return await channel.send(message)
