"""From a Slack event to a stored submission (after the ack, in the conversation's lane).

* A message for Steward (a DM, a mention, a reply in a thread it follows) from an allowed
  person becomes one `submit` through the port, keyed by `[event_id, "<channel>:<ts>"]`: a retried
  event, a replay hours later, or the same message arriving as both `app_mention` and
  `message` is a no-op, forever. Entering a thread it did not follow yet, Steward first
  records the thread's earlier messages as history. Text files are read into the text;
  images and documents are kept through the port (`files.py`) and referred to from the data.
* Everyone else is refused once per conversation (a keyed delivery, so never twice) or
  ignored, by `[slack] unlisted`. Other bots are ignored unless `answer_bots`.
* An edit of a message whose answer is still to come is submitted as a new message,
  "(edited) <text>", keyed `<channel>:<ts>:edited:<edit ts>`; an edit of an answered one is
  recorded as a note in the conversation (context for what follows, no new answer).
* A deletion is recorded as a note. A turn for it that has not started yet (still
  pending, or queued behind an older turn) is withdrawn in the same commit: it never runs,
  nothing is posted, and the model's context leaves the message out. An answer already
  being worked on is not shown (see `outbound.py`). Deleting a thread's parent message
  arrives as a `message_changed` to a tombstone and is treated the same.
* An event whose processing fails `ATTEMPTS` times is quarantined with the reason (listed
  by `steward quarantine`) and leaves the journal, so it never comes back at every start;
  unless the failure is an outage (Slack's, or a store that does not answer): then it stays
  journaled and the next start takes it again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

from bot.port import REF, AgentPort, kill_point
from connectors.slack.config import SlackConfig

from . import faults, routing
from .events import Identity, Inbound, clean_text, is_event_id, parse
from .files import Files
from .history import People, replies_after, thread_history
from .lanes import Lanes
from .routing import CHANNEL, HISTORY_CHANNEL, deleted_ref
from .working import Working

log = logging.getLogger(__name__)

ATTEMPTS = 3
QUARANTINE_REASON = 1000  # characters of a quarantine's reason
SAID_TAIL = 200  # newest entries searched for a deleted message and its edits
REFUSAL = ("Sorry, I am a personal assistant and only talk with the people I was set up "
           "for. My owner can add you to `allowed_users`.")


def quarantine_id(body: Any) -> str:
    """What a quarantined event is recorded under: its event id, or for a body without a
    usable one, a digest of the body (the same body twice is one entry)."""
    event_id = body.get("event_id") if isinstance(body, dict) else None
    if is_event_id(event_id):
        return event_id
    raw = json.dumps(body, sort_keys=True, default=repr).encode()
    return "body:" + hashlib.sha256(raw).hexdigest()[:32]


def _outage(exc: BaseException) -> bool:
    """Slack's outage, raised as it is or as the cause of what was raised."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 5:
        if faults.is_outage(cause):
            return True
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    return False


class Inbox:
    def __init__(self, port: AgentPort, config: SlackConfig, *, files: Files, people: People,
                 working: Working, web, agent_name: str,
                 done: Callable[[str], None] = lambda _event_id: None,
                 concurrency: int = 16):
        self.port = port
        self.config = config
        self.files = files
        self.people = people
        self.working = working
        self.web = web
        self.agent_name = agent_name
        self.done = done  # an event's processing committed (the journal forgets it)
        self.me: Identity | None = None
        self.lanes = Lanes(self._process, concurrency)

    # -- before the ack (any thread) -----------------------------------------------

    def admit(self, body: dict) -> Inbound | None:
        """The event of an `event_callback` body if it may concern Steward. Events that
        never can (its own messages, joins, channel chatter outside threads) are dropped
        here, before anything is journaled or stored. Pure: safe on any thread."""
        assert self.me is not None, "start() reads the identity first"
        ev = parse(body, self.me)
        return ev if ev is not None and routing.may_concern_steward(ev) else None

    # -- on the agent's loop -------------------------------------------------------

    def enqueue(self, ev: Inbound) -> None:
        self.lanes.put(routing.conversation_key(ev), ev.order, ev)

    async def _process(self, ev: Inbound) -> None:
        failure: Exception | None = None
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await getattr(self, f"_on_{ev.kind}")(ev)
                failure = None
                break
            except Exception as exc:
                failure = exc
                if attempt < ATTEMPTS:
                    log.warning("slack: event %s failed, retrying", ev.event_id,
                                exc_info=True)
                    await asyncio.sleep(0.2 * 2 ** attempt)
        if failure is not None and not await self._give_up(ev, failure):
            return  # left in the journal: retried on the next start
        self.done(ev.event_id)

    async def _give_up(self, ev: Inbound, exc: Exception) -> bool:
        """After the last attempt: quarantine the event unless the failure is an outage
        (Slack's, or the store's: it is probed), which is no fault of the event's and is
        left journaled for the next start. True once quarantined."""
        if _outage(exc):
            log.warning("slack: event %s failed %d times while Slack is unavailable (%s); "
                        "it stays journaled", ev.event_id, ATTEMPTS, faults.describe(exc))
            return False
        log.error("slack: event %s (%s) failed %d times", ev.event_id, ev.kind, ATTEMPTS,
                  exc_info=exc)
        external_id = quarantine_id(ev.raw)
        try:  # also a probe: a store that does not answer is an outage, not the event's
            known = await self.port.submission(CHANNEL, external_id)
        except Exception:
            log.warning("slack: the store is unavailable; event %s stays journaled",
                        ev.event_id, exc_info=True)
            return False
        if known is not None and known["state"] != "quarantined":
            external_id += ":failed"  # taken in before it failed (the catch-up after a
            # mention's commit, say): listed all the same
        return await self.quarantine(
            ev.raw, f"{ev.kind} {ev.channel}:{ev.ts} could not be taken in ({ATTEMPTS} "
            f"attempts): {faults.describe(exc)}", external_id=external_id)

    async def quarantine(self, body: Any, reason: str, *, external_id: str | None = None
                         ) -> bool:
        """Record an event that cannot be taken in, with the reason, where `steward
        quarantine` lists it. It is kept under its event id, which a submission of the
        event would carry too: a retry or a replay of it can never be submitted later. The
        body is kept with it (left out if the store refuses it). True once stored (or
        stored before); False: the store failed, the caller leaves it journaled."""
        external_id = external_id or quarantine_id(body)
        for payload in (body, None):
            try:
                new = await self.port.quarantine(CHANNEL, [external_id],
                                                 reason[:QUARANTINE_REASON], payload)
            except Exception:
                log.exception("slack: quarantining event %s failed", external_id)
                continue
            if new:
                log.warning("slack: event %s quarantined: %s", external_id, reason)
            return True
        return False

    def _ids(self, ev: Inbound, message_id: str) -> list[str]:
        return [i for i in (ev.event_id, message_id) if i]

    async def _seen(self, message_id: str, key: str) -> bool:
        """Handled before: submitted, or recorded as history of this same conversation (a
        thread read on entering it). History in another conversation does not count: the
        DM message a thread hangs under is context of the thread, and a message of the DM."""
        if await self.port.submission(CHANNEL, message_id) is not None:
            return True
        history = await self.port.submission(HISTORY_CHANNEL, message_id)
        if history is None:
            return False
        conversation = await self.port.conversation(key)
        return conversation is not None and conversation.id == history["conversation_id"]

    async def _followed(self, key: str) -> bool:
        """Steward follows a thread once it has a transcript for it."""
        conversation = await self.port.conversation(key)
        return conversation is not None and conversation.last_seq > 0

    async def _on_message(self, ev: Inbound) -> None:
        message_id = f"{ev.channel}:{ev.ts}"
        key = routing.conversation_key(ev)
        if await self._seen(message_id, key):
            # Seen before (another event type, a retry, a replay, thread history). A
            # replay may have stopped between the mention's commit and the catch-up.
            if ev.replayed and self._opens_thread(ev):
                await self._catch_up(ev)
            return
        followed = await self._followed(key)
        if not (routing.always_addressed(ev) or followed):
            return
        decision = routing.access(self.config, ev)
        if decision == "refuse":
            await self._refuse(ev, key, self._ids(ev, message_id))
        if decision != "allow":
            return
        if ev.thread_ts and not followed:
            assert self.me is not None
            earlier = await thread_history(self.web, self.me, self.people, ev,
                                           own_name=self.agent_name)
            if earlier:
                await self.port.history(channel=CHANNEL, conversation_key=key,
                                        messages=earlier, owner=routing.owner(ev),
                                        scope=routing.scope(ev))
        files, refs = await self.files.describe(ev.files, keep=self.port.keep)
        await self._submit(ev, key, self._ids(ev, message_id), clean_text(ev.text, self.me)
                           + files, attachments=refs)
        kill_point("slack-submitted")
        if self._opens_thread(ev) and not followed:
            await self._catch_up(ev)

    @staticmethod
    def _opens_thread(ev: Inbound) -> bool:
        """A message at a channel's top level: Steward answers it in a thread under it."""
        return routing.thread_root(ev) == ev.ts

    async def _catch_up(self, ev: Inbound) -> None:
        """Replies in the thread a mention opens, that reached Steward before the mention
        (Slack does not keep order across retries) and were passed over then as chatter in
        a thread it did not follow: taken now, in order, as if they came after."""
        assert self.me is not None
        for m in await replies_after(self.web, ev):
            event = {**m, "type": "message", "channel": ev.channel,
                     "channel_type": ev.channel_type}
            reply = parse({"event": event, "team_id": ev.team}, self.me)
            if reply is not None and reply.kind == "message" and reply.thread_ts == ev.ts:
                await self._on_message(reply)

    async def _submit(self, ev: Inbound, key: str, ids: list[str], text: str, *,
                      attachments: list[dict] = ()) -> None:
        where = routing.reply_to(ev)
        person = await self.people.person(ev.user)
        accepted = await self.port.submit(
            channel=CHANNEL, external_ids=ids, conversation_key=key, text=text,
            author=person.name, owner=routing.owner(ev), scope=routing.scope(ev),
            reply_to=where, timezone=person.timezone,
            data={"slack": {"channel": ev.channel, "ts": ev.ts, "user": ev.user,
                            "thread_ts": ev.thread_ts, "event_id": ev.event_id},
                  **({REF: list(attachments)} if attachments else {})})
        if not accepted.duplicate:
            await self.working.start(where)

    async def _refuse(self, ev: Inbound, key: str, ids: list[str]) -> None:
        # Created with its owner and scope like any other: a refused DM must not make a
        # conversation in the default (terminal user's) scope that the person would inherit
        # once allowed.
        await self.port.refuse(channel=CHANNEL, external_ids=ids, conversation_key=key,
                               text=REFUSAL, reply_to=routing.reply_to(ev),
                               owner=routing.owner(ev), scope=routing.scope(ev),
                               payload={"refused": ev.user})

    async def _original(self, ev: Inbound) -> tuple[dict | None, bool]:
        """The submission of the message an edit or deletion is about, and whether its
        answer is still to come."""
        state = await self.port.submission(CHANNEL, f"{ev.channel}:{ev.ts}")
        if state is None or not state.get("task_id"):
            return None, False
        return state, await self.port.answer_pending(state["task_id"])

    async def _on_edit(self, ev: Inbound) -> None:
        state, pending = await self._original(ev)
        if state is None or routing.access(self.config, ev) != "allow":
            return
        edit_id = f"{ev.channel}:{ev.ts}:edited:{ev.edit_ts}"
        key = routing.conversation_key(ev)
        text = clean_text(ev.text, self.me)  # type: ignore[arg-type]
        if pending:
            await self._submit(ev, key, self._ids(ev, edit_id), f"(edited) {text}")
            return
        await self._note(ev, key, edit_id, f"(edited an earlier message; it now says:) {text}")

    async def _on_delete(self, ev: Inbound) -> None:
        """The deletion is recorded as a note. The turns for the message (and for edits of
        it) that have not started are withdrawn in the same commit: never run, nothing
        posted, the message left out of the context. A turn already working goes on, and
        its answer is not shown (`outbound.py`)."""
        state, _ = await self._original(ev)
        if state is None:
            return
        conversation_id = state["conversation_id"]
        before = ev.previous_text if len(ev.previous_text) < 500 else ev.previous_text[:500] + "…"
        await self.port.withdraw(
            channel=CHANNEL, ref=deleted_ref(ev.channel, ev.ts),
            conversation_id=conversation_id, said=await self._said(conversation_id, ev, state),
            note=f"(deleted an earlier message, which said: {before})",
            withdrawn_note="(deleted this message before it was answered; it was not answered)",
            author=await self.people.name(ev.user),
            data={"slack_note": {"channel": ev.channel, "ts": ev.ts}})

    async def _said(self, conversation_id: int, ev: Inbound, state: dict) -> list:
        """The user entries of a message: itself and its edits submitted as new messages
        (among the newest entries; an older message was answered long ago)."""
        def mine(data: dict) -> bool:
            slack = data.get("slack") or {}
            return slack.get("ts") == ev.ts and slack.get("channel") == ev.channel
        return await self.port.said(conversation_id, state["task_id"], mine, tail=SAID_TAIL)

    async def _note(self, ev: Inbound, key: str, ref: str, text: str) -> None:
        await self.port.history(channel=CHANNEL, conversation_key=key, messages=[{
            "ref": ref, "text": text, "author": await self.people.name(ev.user),
            "role": "user", "data": {"slack_note": {"channel": ev.channel, "ts": ev.ts}}}])
