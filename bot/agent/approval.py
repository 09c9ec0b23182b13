"""Approvals: a tool call that needs the person's yes is a durable wait.

The turn spawns an `approval` task in the call's place (bot/tools/permissions.py says
which calls). It is a workflow:

    ""        the request is delivered to the person who asked (a keyed delivery, in the
              conversation they asked in), with a short code; then it sleeps
    waiting   until answered (an answer wakes it) or expired: yes -> the tool call is
              spawned, marked approved; no, or no answer in time -> the model is told
    ran       the tool's result is the approval's result

An answer is a message "yes CODE" / "no CODE" in any channel (a mail reply, a Slack
message, `steward ask`), or a click on the request's Approve / Deny buttons in Slack
(connectors/slack/actions.py). `answer()` takes it: only from the person the
request went to, only while it waits, and once: it is a submission keyed by the approval,
so a double click, a retried event or a reply after a restart is a no-op. Everything lives
in the store, so the wait survives any number of restarts; a crash after the yes and
before the tool ran resumes at `waiting` and spawns the call (once: its key is the
approval's).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from bot.agent.tool_result import tool_outcome
from bot.channels import Channel, typed_approval
from bot.provenance import MARK, marked
from bot.runtime import Checkpoint, Done, KindSpec, Phase, Sleep, TaskContext, TaskDef, Wait
from store import PENDING, NotFound, Store, Writes

KIND = "approval"
ANSWERS = "approval"  # the submission channel of answers, keyed by the approval's id
CODES = "approval-code"  # code -> approval, so a typed code finds its request
ANSWER = re.compile(r"^\s*(yes|y|approve|approved|ok|no|n|deny|denied)\s+([a-z0-9]{6,12})"
                    r"\s*[.!]?\s*$", re.IGNORECASE)
YES = {"yes", "y", "approve", "approved", "ok"}
# An answer wakes the wait; this bounds it should the answer land while the wait is being
# re-armed (a wake finds the task running then). Longer than `steward resume`'s horizon.
RECHECK_SECONDS = 600.0


def code_of(approval_id: str) -> str:
    return hashlib.sha256(approval_id.encode()).hexdigest()[:8]


def request_text(summary: str, code: str, channel: Channel | None, expires_at: float) -> str:
    """The request's text; how to answer it is the channel's to say (a channel not served
    by this process: by typing, which every channel takes)."""
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(expires_at))
    how = channel.how_to_approve(code) if channel is not None else typed_approval(code)
    return f"Approval needed: may I {summary}?\n{how}. Unanswered by {when}, it is refused."


class Asked(Checkpoint):
    code: str  # what the person types to answer


class Approved(Asked):
    tool_task: str  # the call, running once approved


class Approval(TaskDef):
    kind = KIND

    def __init__(self, store: Store, channels: Mapping[str, Channel] | None = None):
        self.store = store
        self.channels = channels if channels is not None else {}  # by name, as AgentDeps

    async def step(self, ctx: TaskContext):
        return await self.spec.run(self, ctx)

    async def ask(self, ctx: TaskContext, _: None):
        i = ctx.inputs
        code = code_of(ctx.task.id)
        ctx.writes.submit(CODES, code, conversation_id=ctx.task.conversation_id,
                          task_id=ctx.task.id)
        text = request_text(i["summary"], code, self.channels.get(i["channel"]),
                            i["expires_at"])
        ctx.writes.deliver("deliver", {
            "channel": i["channel"], "text": text, "reply_to": i["reply_to"],
            "approval": {"id": ctx.task.id, "code": code, "summary": i["summary"]}},
            key=f"{ctx.task.id}.ask", parent_id=ctx.task.id,
            conversation_id=ctx.task.conversation_id)
        return Sleep(min(RECHECK_SECONDS, max(0.0, i["expires_at"] - time.time())), "waiting",
                     Asked(code=code))

    async def check(self, ctx: TaskContext, cp: Asked):
        i = ctx.inputs
        answer = await self.store.submission_state(ANSWERS, ctx.task.id)
        if answer is None:
            left = i["expires_at"] - time.time()
            if left > 0:
                return Sleep(min(RECHECK_SECONDS, left), "waiting", cp)
            return Done({"content": "error: not run: the person did not approve it in time "
                                    "(the request expired)", "is_error": True,
                         "approval": "expired"})
        payload = json.loads(answer["payload"] or "{}")
        if not payload.get("approved"):
            return Done({"content": "error: not run: the person refused it",
                         "is_error": True, "approval": "denied"})
        # The call keeps the mark of the turn that asked for it (bot/provenance.py): what it
        # stores is still made from outside text, whoever approved it.
        mark = marked(i.get(MARK))
        tool_task = ctx.spawn("tool_call", {"call": i["call"], "approved": True, **mark},
                              idem_key=i["idem_key"])
        return Wait("ran", Approved(code=cp.code, tool_task=tool_task))

    async def ran(self, ctx: TaskContext, cp: Approved):
        task = await self.store.get_task(cp.tool_task)
        content, is_error = tool_outcome(task)
        shown = (task.result or {}).get(MARK) if isinstance(task.result, dict) else None
        return Done({"content": content, "is_error": is_error, "approval": "approved",
                     **marked(shown)})

    # Its phases, in order: the checkpoint each starts from and the code that runs it.
    spec = KindSpec(KIND, version=1, phases=(
        Phase("", None, ask),
        Phase("waiting", Asked, check),
        Phase("ran", Approved, ran),
    ))


@dataclass(frozen=True)
class Answer:
    approval_id: str
    approved: bool


async def find(store: Store, text: str) -> Answer | None:
    """The approval a message like "yes 1a2b3c4d" answers (None: an ordinary message). It
    is the message's first line (a mail's after its subject line; a signature may follow)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and lines[0].startswith("Subject: "):
        lines = lines[1:]
    m = ANSWER.match(lines[0]) if lines else None
    if m is None:
        return None
    known = await store.submission_state(CODES, m.group(2).lower())
    if known is None or not known.get("task_id"):
        return None
    return Answer(known["task_id"], m.group(1).lower() in YES)


async def answer(store: Store, approval_id: str, approved: bool, *, by: str | None,
                 writes: Writes | None = None) -> str:
    """Apply a person's answer, once. `by` is who answered, as conversations name their
    owner ("slack:T:U", an email address, "local"). Returns what happened, for the
    channel to show: "approved", "denied", "already answered", "not yours", "expired"."""
    try:
        task = await store.get_task(approval_id)
    except NotFound:
        return "unknown"
    if task.kind != KIND:
        return "unknown"
    if by is None or by != task.inputs.get("who"):
        return "not yours"
    if task.terminal or time.time() >= task.inputs["expires_at"]:
        return "already answered" if task.terminal else "expired"
    w = writes or Writes()
    # Keyed by the approval: a second answer makes the whole commit a no-op.
    w.submit(ANSWERS, approval_id, conversation_id=task.conversation_id,
             payload={"approved": approved, "by": by})
    if task.state == PENDING:
        w.wake(approval_id)
    if (await store.commit(w)).duplicate:
        return "already answered"
    return "approved" if approved else "denied"


async def answered(store: Store, approval_id: str) -> tuple[bool, str] | None:
    """How an approval was answered: (approved, by whom), or None while unanswered."""
    state = await store.submission_state(ANSWERS, approval_id)
    if state is None:
        return None
    payload = json.loads(state["payload"] or "{}")
    return bool(payload.get("approved")), str(payload.get("by") or "")
