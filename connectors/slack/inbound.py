"""From a Slack event to a stored submission (after the ack, in the conversation's lane).

* A message for Steward (a DM, a mention, a reply in a thread it follows) from an allowed
  person becomes one `submit_message` keyed by `[event_id, "<channel>:<ts>"]`: a retried
  event, a replay hours later, or the same message arriving as both `app_mention` and
  `message` is a no-op, forever. Entering a thread it did not follow yet, Steward first
  records the thread's earlier messages as history. Text files are read into the text.
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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bot.agent.deliver import Deliver
from bot.agent.deps import AgentDeps
from bot.agent.inbox import add_history, submit_message, withdraw_message
from bot.config import SlackConfig
from store import TERMINAL, Entry, NotFound, Writes

from . import routing
from .events import Identity, Inbound, clean_text, parse
from .files import Files
from .history import People, thread_history
from .lanes import Lanes
from .outbound import HISTORY_CHANNEL, deleted_ref
from .working import Working

log = logging.getLogger(__name__)

CHANNEL = "slack"
ATTEMPTS = 3
SAID_TAIL = 200  # newest entries searched for a deleted message and its edits
REFUSAL = ("Sorry, I am a personal assistant and only talk with the people I was set up "
           "for. My owner can add you to `allowed_users`.")


class Inbox:
    def __init__(self, deps: AgentDeps, config: SlackConfig, *, files: Files, people: People,
                 working: Working, web, agent_name: str,
                 done: Callable[[str], None] = lambda _event_id: None,
                 concurrency: int = 16):
        self.deps = deps
        self.store = deps.store
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
        for attempt in range(1, ATTEMPTS + 1):
            try:
                await getattr(self, f"_on_{ev.kind}")(ev)
                break
            except Exception:
                if attempt == ATTEMPTS:  # left in the journal: retried on the next start
                    log.exception("slack: event %s (%s) failed", ev.event_id, ev.kind)
                    return
                log.warning("slack: event %s failed, retrying", ev.event_id, exc_info=True)
                await asyncio.sleep(0.2 * 2 ** attempt)
        self.done(ev.event_id)

    def _ids(self, ev: Inbound, message_id: str) -> list[str]:
        return [i for i in (ev.event_id, message_id) if i]

    async def _seen(self, message_id: str) -> bool:
        for channel in (CHANNEL, HISTORY_CHANNEL):
            if await self.store.submission_state(channel, message_id) is not None:
                return True
        return False

    async def _followed(self, key: str) -> bool:
        """Steward follows a thread once it has a transcript for it."""
        try:
            return (await self.store.get_conversation(key)).last_seq > 0
        except NotFound:
            return False

    async def _on_message(self, ev: Inbound) -> None:
        message_id = f"{ev.channel}:{ev.ts}"
        if await self._seen(message_id):
            return  # seen before (another event type, a retry, a replay, thread history)
        key = routing.conversation_key(ev)
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
                await add_history(self.store, channel=CHANNEL, conversation_key=key,
                                  messages=earlier, owner=routing.owner(ev),
                                  scope=routing.scope(ev))
        text = clean_text(ev.text, self.me) + await self.files.describe(ev.files)
        await self._submit(ev, key, self._ids(ev, message_id), text)

    async def _submit(self, ev: Inbound, key: str, ids: list[str], text: str) -> None:
        where = routing.reply_to(ev)
        person = await self.people.person(ev.user)
        accepted = await submit_message(
            self.store, channel=CHANNEL, external_ids=ids, conversation_key=key, text=text,
            author=person.name, owner=routing.owner(ev), scope=routing.scope(ev),
            reply_to=where, timezone=person.timezone,
            data={"slack": {"channel": ev.channel, "ts": ev.ts, "user": ev.user,
                            "thread_ts": ev.thread_ts, "event_id": ev.event_id}})
        if not accepted.duplicate:
            self.deps.wake()
            await self.working.start(where)

    async def _refuse(self, ev: Inbound, key: str, ids: list[str]) -> None:
        # Created with its owner and scope like any other: a refused DM must not make a
        # conversation in the default (terminal user's) scope that the person would inherit
        # once allowed.
        conversation = await self.store.ensure_conversation(
            key, owner=routing.owner(ev), scope=routing.scope(ev))
        w = Writes()
        w.submit(CHANNEL, *ids, conversation_id=conversation.id, payload={"refused": ev.user})
        w.deliver(Deliver.kind, {"channel": CHANNEL, "text": REFUSAL,
                                 "reply_to": routing.reply_to(ev)},
                  key=f"slack-refusal:{key}", conversation_id=conversation.id)
        if not (await self.store.commit(w)).duplicate:
            self.deps.wake()

    async def _original(self, ev: Inbound) -> tuple[dict | None, bool]:
        """The submission of the message an edit or deletion is about, and whether its
        answer is still to come."""
        state = await self.store.submission_state(CHANNEL, f"{ev.channel}:{ev.ts}")
        if state is None or not state.get("task_id"):
            return None, False
        turn = await self.store.get_task(state["task_id"])
        return state, turn.state not in TERMINAL

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
        withdrawn = await withdraw_message(
            self.store, channel=CHANNEL, ref=deleted_ref(ev.channel, ev.ts),
            conversation_id=conversation_id, said=await self._said(conversation_id, ev, state),
            note=f"(deleted an earlier message, which said: {before})",
            withdrawn_note="(deleted this message before it was answered; it was not answered)",
            author=await self.people.name(ev.user),
            data={"slack_note": {"channel": ev.channel, "ts": ev.ts}})
        if withdrawn:
            self.deps.wake()  # the turn queued behind a withdrawn one may start now

    async def _said(self, conversation_id: int, ev: Inbound, state: dict) -> list[Entry]:
        """The user entries of a message: itself and its edits submitted as new messages
        (among the newest entries; an older message was answered long ago)."""
        page = await self.store.entries_page(conversation_id, limit=SAID_TAIL)
        said = [e for e in page if e.kind == "user" and e.task_id
                and ((e.data or {}).get("slack") or {}).get("ts") == ev.ts
                and ((e.data or {}).get("slack") or {}).get("channel") == ev.channel]
        if not said:
            first = await self.store.entry_of_task(conversation_id, state["task_id"])
            said = [first] if first is not None and first.kind == "user" else []
        return said

    async def _note(self, ev: Inbound, key: str, ref: str, text: str) -> None:
        await add_history(self.store, channel=CHANNEL, conversation_key=key, messages=[{
            "ref": ref, "text": text, "author": await self.people.name(ev.user),
            "role": "user", "data": {"slack_note": {"channel": ev.channel, "ts": ev.ts}}}])
