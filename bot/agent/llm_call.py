"""An LLM call as a task: the pinned request is the input, the reply the result.

Policy `safe`: a call cut off by a crash is sent again with the same request. A provider
still down or overloaded after its retries hands the request to the next of `[llm]
fallbacks` (with that one's model); the ledger records who answered. A server that is
restarting is waited for (`[llm] wait_for_server_seconds`, `bot.llm.retry`) while the call
stays a running task. While it
streams, the text so far is committed at most every `PARTIAL_EVERY` seconds, so a restart
loses at most that much; the partial of a dead attempt becomes an `aborted` entry, kept
for the record but never shown to the model.
"""

import json
import logging
import time

from bot.agent.capacity import learn_from_overflow
from bot.agent.context import request_chars
from bot.agent.deps import AgentDeps
from bot.agent.events import Event
from bot.llm.errors import ContextOverflow, LLMError, TransientError
from bot.llm.retry import restarting, stream_with_retries
from bot.llm.types import Response
from bot.redact import redact
from bot.runtime import Effect, EffectMark, Policy, TaskContext, effect_spec
from bot.runtime.killpoints import kill_point
from store import UsageRecord, Writes, is_unavailable

PARTIAL_EVERY = 0.1  # seconds between commits of streamed text
WAITING_SINCE = "server_wait_since"  # checkpoint: when the server was found restarting

log = logging.getLogger(__name__)


class LLMCallMark(EffectMark):
    server_wait_since: float | None = None  # WAITING_SINCE


class LLMCall(Effect):
    kind = "llm_call"
    policy = Policy.SAFE
    spec = effect_spec(kind, LLMCallMark)

    def __init__(self, deps: AgentDeps):
        self.deps = deps

    def settled_inputs(self, ctx: TaskContext) -> dict:
        """Once answered, the pinned request has done its job (it is only there to send the
        same call again after a crash) and is the bulk of the database: a long window is a
        few hundred KB per call. What it held is in the transcript; keep its outline."""
        kept = {k: v for k, v in ctx.inputs.items() if k not in ("request", "request_json")}
        if "request_outline" in kept:
            return kept
        request = ctx.inputs.get("request") or {}  # pinned by an earlier build
        return {**kept, "request_outline": {
            "model": request.get("model"), "messages": len(request.get("messages", [])),
            "tools": len(request.get("tools", [])),
            "chars": len(json.dumps(request, ensure_ascii=False))}}

    async def perform(self, ctx: TaskContext):
        conv_id = ctx.task.conversation_id
        checkpoint = dict(ctx.checkpoint or {})
        if checkpoint.get("partial"):
            aborted = Writes()
            aborted.append(conv_id, "aborted", checkpoint.pop("partial"), task_id=ctx.task.id,
                           data={"reason": "Steward stopped while this reply streamed"})
            await ctx.save_checkpoint(checkpoint, aborted)
            self.deps.events.publish(Event(conv_id, "retry", {"task": ctx.task.id,
                                                              "turn": ctx.task.parent_id}))

        # When an earlier process was waiting for a restarting server (`bot.llm.retry`):
        # this one goes on waiting, for what is left of the time, however it finds it.
        waiting_since = checkpoint.get(WAITING_SINCE)
        request = self.deps.pinned.take(ctx.task.id, ctx.inputs)
        quiet = ctx.inputs.get("quiet", False)
        streamed = ""
        last_commit = time.monotonic()  # a reply faster than one window commits no partial

        async def on_text(delta: str) -> None:
            nonlocal streamed, last_commit
            streamed += delta
            if time.monotonic() - last_commit >= PARTIAL_EVERY:
                last_commit = time.monotonic()
                try:
                    await ctx.save_checkpoint({**checkpoint, "partial": streamed})
                except Exception as exc:
                    # The store is away: the reply streams on and lands with its result
                    # (the runner waits for the store); nothing uncommitted is shown.
                    if not is_unavailable(exc):
                        raise
                    return
                # Nothing streams from a summary, nor in a restored home's first hour: its
                # predecessor may have answered since the snapshot, which only the whole
                # answer's delivery asks the channel about (bot/agent/deliver.py).
                if not quiet and time.time() >= self.deps.reconcile_until:
                    self.deps.events.publish(Event(conv_id, "partial", {
                        "task": ctx.task.id, "turn": ctx.task.parent_id, "text": streamed,
                        # the answer's key, less ".answer": where a channel shows the text
                        "answer": ctx.inputs.get("answer") or ctx.task.parent_id,
                        "channel": ctx.inputs.get("channel"),
                        "reply_to": ctx.inputs.get("reply_to")}))
                kill_point("mid-stream", self.kind)

        async def on_retry(attempt: int, error: Exception, delay: float) -> None:
            nonlocal streamed
            streamed = ""
            if WAITING_SINCE not in checkpoint and restarting(client, error):
                checkpoint[WAITING_SINCE] = time.time()
            await ctx.save_checkpoint({**checkpoint, "partial": ""})
            self.deps.events.publish(Event(conv_id, "retry", {
                "task": ctx.task.id, "turn": ctx.task.parent_id, "error": redact(str(error))}))

        chain = [(self.deps.client, self.deps.config.llm), *self.deps.fallbacks]
        client, priced = chain[0]

        async def on_attempt(response: Response | None, error: Exception | None) -> None:
            usage = response.usage if response else None
            record = UsageRecord(
                provider=client.provider,
                model=(response.model if response else "") or sent.model or client.model,
                input_tokens=usage.input_tokens if usage else 0,
                output_tokens=usage.output_tokens if usage else 0,
                cache_read_tokens=usage.cache_read_tokens if usage else 0,
                cache_write_tokens=usage.cache_write_tokens if usage else 0,
                cost_usd=0.0 if usage is None else usage.cost_usd
                if usage.cost_usd is not None else priced.cost_usd(usage),
                ok=error is None, error=None if error is None else redact(
                    f"{type(error).__name__}: {error}"),
                task_id=ctx.task.id, conversation_id=conv_id)
            if error is None:
                ctx.writes.record_usage(record)  # lands with the result
            else:
                failed = Writes()
                failed.record_usage(record)
                await self.deps.store.commit(failed)

        runtime = self.deps.config.runtime
        sent = request
        # `client`, `priced` and `sent` are read by on_attempt: the one being tried.
        for n, (client, priced) in enumerate(chain):  # noqa: B007
            # A fallback answers the same request with its own model.
            sent = request if n == 0 else request.model_copy(update={"model": client.model})
            try:
                response = await stream_with_retries(
                    client, sent, on_text, on_attempt=on_attempt, on_retry=on_retry,
                    max_attempts=runtime.max_attempts, base_delay=runtime.retry_base_seconds,
                    max_delay=min(60.0, runtime.retry_max_seconds),
                    wait_for_server=_left(priced.wait_for_server_seconds, waiting_since),
                    seen=waiting_since is not None)
                break
            except TransientError as exc:  # still down or overloaded after its retries
                if n + 1 == len(chain):
                    return _failed(exc)
                log.warning("llm: %s %s unavailable (%s); trying the fallback %s %s",
                            client.provider, sent.model or client.model, type(exc).__name__,
                            chain[n + 1][0].provider, chain[n + 1][0].model)
                await on_retry(0, exc, 0.0)  # what it streamed is taken back
            except LLMError as exc:
                # Retrying is pointless: the turn tells the user what went wrong (or, for a
                # context overflow, compacts and tries once more).
                if isinstance(exc, ContextOverflow) and n == 0:  # the server said its size
                    await learn_from_overflow(self.deps.store, self.deps.config, client, exc)
                return _failed(exc)
        return {"response": response.model_dump(mode="json"),
                "request_chars": request_chars(request)}


def _left(limit: float, since: float | None) -> float:
    """Seconds of the wait for a restarting server not spent yet (by wall clock: an
    earlier process may have spent some)."""
    return limit if since is None else max(0.0, limit - (time.time() - since))


def _failed(exc: LLMError) -> dict:
    # Kept in the task's result, which the inspector and `steward tasks` show: redacted.
    return {"error": redact(str(exc)), "error_type": type(exc).__name__,
            "retry_after": getattr(exc, "retry_after", None),
            "key_env": getattr(exc, "key_env", None)}
