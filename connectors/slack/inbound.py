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
  by `steward quarantine`) and leaves the journal, so it never comes back at every start.
* An outage is never the event's fault (`faults.outage_of`: the store's — its connection
  lost, its server restarting, its disk full, even while reads still work — or Slack's).
  The event stays journaled and is tried again by itself, with backoff (0.5 s doubling to
  `OUTAGE_RETRY_MAX`), as long as the outage lasts, its conversation's lane parked
  meanwhile (`lanes.py`: the messages after it wait behind it, other conversations go
  on); it is not counted against its attempts and never quarantined for it. The outage is
  logged once when it begins and once when it ends (`Outages`), not once per event or try.
* Messages read from Slack's history after Steward was away (`catchup.py`) take the same
  path under the same ids, so one that also arrives as an event is taken once; they are in
  no journal, and `settled` is told when each is taken (or quarantined).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from bot.port import REF, AgentPort
from bot.runtime.killpoints import kill_point
from connectors.slack.config import SlackConfig

from . import faults, routing
from .events import Identity, Inbound, clean_text, is_event_id, parse
from .files import Files
from .history import People, replies_after, thread_history
from .lanes import Lanes
from .messages import Posted
from .routing import CHANNEL, HISTORY_CHANNEL, deleted_ref
from .working import Working

log = logging.getLogger(__name__)

ATTEMPTS = 3
OUTAGE_RETRY_FIRST = 0.5  # seconds before an event an outage held is tried again; doubles
OUTAGE_RETRY_MAX = 10.0  # ...up to this, for as long as the outage lasts
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


def outage_pause(tries: int) -> float:
    """Seconds to wait before trying again what an outage held `tries` times before."""
    base = min(OUTAGE_RETRY_MAX, OUTAGE_RETRY_FIRST * 2 ** min(tries, 16))
    return base * (1 + random.random() / 5)


class Outages:
    """The outages holding events now, said once when each begins and once when it ends
    (the first held event taken in after it)."""

    BEGAN = {"store": "the store is unavailable (%s); events are kept and taken in by "
                      "themselves when it is back",
             "slack": "Slack is unavailable (%s); events are kept and taken in by "
                      "themselves when it answers again"}
    ENDED = {"store": "the store is back after %.0f s; the %d events it held are taken in",
             "slack": "Slack answers again after %.0f s; the %d events it held are taken in"}

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def __contains__(self, kind: str) -> bool:
        return kind in self._since

    def began(self, kind: str, exc: BaseException, *, new: bool = True) -> None:
        """An event is held by `kind`'s outage (`new`: for the first time)."""
        if kind not in self._since:
            self._since[kind] = time.monotonic()
            self._held[kind] = 0
            log.warning("slack: " + self.BEGAN[kind], faults.describe(exc))
            new = True
        self._held[kind] += int(new)

    def ended(self, kinds: set[str]) -> None:
        for kind in kinds:
            since = self._since.pop(kind, None)
            if since is not None:
                log.warning("slack: " + self.ENDED[kind], time.monotonic() - since,
                            self._held.pop(kind, 0))


@dataclass(eq=False)
class _Work:
    """An event in its lane, with what outages did to it so far."""

    ev: Inbound
    waits: int = 0  # times an outage parked it
    held: set[str] = field(default_factory=set)  # whose outages ("store", "slack")


class _Park(Exception):  # noqa: N818 - not an error: the lane waits this long
    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


class Inbox:
    def __init__(self, port: AgentPort, config: SlackConfig, *, files: Files, people: People,
                 working: Working, web, agent_name: str,
                 done: Callable[[str], None] = lambda _event_id: None,
                 settled: Callable[[Inbound], None] = lambda _ev: None,
                 concurrency: int = 16):
        self.port = port
        self.config = config
        self.files = files
        self.people = people
        self.working = working
        self.web = web
        self.agent_name = agent_name
        self.done = done  # an event's processing committed (the journal forgets it)
        self.settled = settled  # the same for a message caught up from history
        # Steward's posts Slack shows answering a message (Messages.answer_to): asked in a
        # home just restored from a backup, for what its predecessor answered.
        self.answer_to: Callable[[dict, str], Awaitable[list[Posted]]] | None = None
        self.me: Identity | None = None
        self.lanes = Lanes(self._process, concurrency)
        self.outages = Outages()

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
        self.lanes.put(routing.conversation_key(ev), ev.order, _Work(ev))

    async def _process(self, work: _Work) -> float | None:
        """The lanes' handler: None once the event is finished with; a number of seconds
        to park its lane for, when an outage holds it."""
        ev = work.ev
        try:
            taken = await self._take(work)
        except _Park as park:
            return park.seconds
        if not taken:
            return None  # left in the journal: retried on the next start
        if ev.caught_up:
            self.settled(ev)
        else:
            self.done(ev.event_id)
        return None

    async def _take(self, work: _Work) -> bool:
        """Process the event: True once taken in or quarantined; False: it could not even
        be quarantined (left for the next start). Raises `_Park` when an outage holds it."""
        ev = work.ev
        failures = 0
        while True:
            try:
                await self._handler(ev.kind)(ev)
            except Exception as exc:
                kind = faults.outage_of(exc)
                if kind is not None:  # no fault of the event's: wait, and try it again
                    self.outages.began(kind, exc, new=kind not in work.held)
                    work.held.add(kind)
                    work.waits += 1
                    raise _Park(outage_pause(work.waits - 1)) from None
                failures += 1
                if failures < ATTEMPTS:
                    log.warning("slack: event %s failed, retrying", ev.event_id or ev.ts,
                                exc_info=True)
                    await asyncio.sleep(0.2 * 2 ** failures)
                    continue
                self.outages.ended(work.held)
                return await self._give_up(ev, exc)
            self.outages.ended(work.held)
            return True

    async def _give_up(self, ev: Inbound, exc: Exception) -> bool:
        """After the last attempt of a failure that is no outage: quarantine the event.
        True once quarantined."""
        log.error("slack: event %s (%s) failed %d times", ev.event_id or ev.ts, ev.kind,
                  ATTEMPTS, exc_info=exc)
        external_id = quarantine_id(ev.raw)
        try:
            known = await self._holding(lambda: self.port.submission(CHANNEL, external_id))
        except Exception as read_failed:  # noqa: BLE001 - listed under its own id, then
            log.warning("slack: reading what event %s was taken as failed: %s",
                        ev.event_id or ev.ts, faults.describe(read_failed))
            known = None
        if known is not None and known["state"] != "quarantined":
            external_id += ":failed"  # taken in before it failed (the catch-up after a
            # mention's commit, say): listed all the same
        return await self.quarantine(
            ev.raw, f"{ev.kind} {ev.channel}:{ev.ts} could not be taken in ({ATTEMPTS} "
            f"attempts): {faults.describe(exc)}", external_id=external_id)

    async def _holding(self, call: Callable[[], Any]) -> Any:
        """`await call()`, waiting out the store's outage (tried again with backoff)."""
        waits = 0
        while True:
            try:
                result = await call()
            except Exception as exc:
                if faults.outage_of(exc) != "store":
                    raise
                self.outages.began("store", exc, new=not waits)
                await asyncio.sleep(outage_pause(waits))
                waits += 1
                continue
            if waits:
                self.outages.ended({"store"})
            return result

    async def quarantine(self, body: Any, reason: str, *, external_id: str | None = None
                         ) -> bool:
        """Record an event that cannot be taken in, with the reason, where `steward
        quarantine` lists it. It is kept under its event id, which a submission of the
        event would carry too: a retry or a replay of it can never be submitted later. The
        body is kept with it (left out if the store refuses it). The store's outage is
        waited out. True once stored (or stored before); False: the store refused it, the
        caller leaves it journaled."""
        external_id = external_id or quarantine_id(body)
        for payload in (body, None):
            try:  # the store's outage is waited out: it is not the event's fault either
                new = await self._holding(lambda p=payload: self.port.quarantine(
                    CHANNEL, [external_id], reason[:QUARANTINE_REASON], p))
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

    async def _spoke_in(self, ev: Inbound) -> bool:
        """Whether any message of Steward's is in `ev`'s thread (Slack's view)."""
        assert self.me is not None
        page = await self.web.call("conversations_replies", channel=ev.channel,
                                   ts=ev.thread_ts, limit=200)
        return any(m.get("bot_id") == self.me.bot_id or m.get("user") == self.me.user_id
                   for m in page.get("messages") or [])

    async def _followed(self, key: str) -> bool:
        """Steward follows a thread once it has a transcript for it."""
        conversation = await self.port.conversation(key)
        return conversation is not None and conversation.last_seq > 0

    def _handler(self, kind: str):
        """What takes in an event of `kind` (events.py makes these three)."""
        return {"message": self._on_message, "edit": self._on_edit,
                "delete": self._on_delete}[kind]

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
        if not (routing.always_addressed(ev) or followed) and ev.thread_ts \
                and self.answer_to is not None and self.port.reconciling():
            # A home restored from a backup has no transcript of a thread its predecessor
            # joined after the snapshot: Slack shows whether Steward spoke in it.
            followed = bool(await self.answer_to(routing.reply_to(ev), ev.thread_ts)) or \
                await self._spoke_in(ev)
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
        if self.answer_to is not None and self.port.reconciling():
            # A restored home takes in again what came after the snapshot (the journal, the
            # catch-up, a retried event); its predecessor may have answered it already.
            answer = await self.answer_to({**where, "message_ts": ev.ts}, ev.ts)
            if answer:
                await self._answered_before(ev, key, ids, text, answer)
                return
        person = await self.people.person(ev.user)
        accepted = await self.port.submit(
            channel=CHANNEL, external_ids=ids, conversation_key=key, text=text,
            author=person.name, owner=routing.owner(ev), scope=routing.scope(ev),
            reply_to=where, timezone=person.timezone, answers=ids[-1],  # the message's id
            data={"slack": {"channel": ev.channel, "ts": ev.ts, "user": ev.user,
                            "thread_ts": ev.thread_ts, "event_id": ev.event_id},
                  **({REF: list(attachments)} if attachments else {})})
        if not accepted.duplicate:
            await self.working.start(where)

    async def _answered_before(self, ev: Inbound, key: str, ids: list[str], text: str,
                               answer: list[Posted]) -> None:
        """A message the home before a restore answered: not answered again, but taken
        into the transcript with that answer as history, so that later context has both
        (unless a turn is waiting: history behind its message would hide it from it; the
        lane keeps new messages of this conversation out meanwhile)."""
        person = await self.people.person(ev.user)
        said = [{"ref": f"{ev.channel}:{ev.ts}", "text": text, "author": person.name,
                 "data": {"slack": {"channel": ev.channel, "ts": ev.ts, "user": ev.user}}}]
        said += [{"ref": f"{p.channel}:{p.ts}", "text": p.text, "author": self.agent_name,
                  "role": "assistant", "data": {"slack": {"channel": p.channel, "ts": p.ts}}}
                 for p in answer]
        await self.port.history(channel=CHANNEL, conversation_key=key, messages=said,
                                owner=routing.owner(ev), scope=routing.scope(ev),
                                settled_only=True)
        await self.port.skip(CHANNEL, ids, {"skipped": "answered before the restore"})
        log.info("slack: %s was answered before the restore", ids[-1])

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
