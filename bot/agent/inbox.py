"""Accepting an inbound message: one commit stores the submission (deduplicated forever
by the channel's own ids), the user's entry and the turn that will answer it. And taking
one back: a message deleted before its turn started withdraws that turn, in the commit
that records the deletion."""

import asyncio
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bot.agent import approval
from bot.agent.context import WITHDRAWS
from bot.memory.transcript import WITHDRAWN
from bot.tools.base import known_timezone
from store import PENDING, RUNNING, Conversation, Entry, Store, Task, Writes

TURN = "turn"
ASKER = "asker"  # a turn's input: the person whose message it answers
TIMEZONE = "timezone"  # a turn's input (and its message's data): the author's IANA zone
ANSWER_KEY = "answer_key"  # a turn's input: its answer's key, from the message it answers


def answer_key(channel: str, external_id: str) -> str:
    """The key of the answer to a message, derived from the message alone: the same in any
    home that takes that message in, so a home restored from a backup finds, by the
    delivery's usual reconcile (`Channel.find`), an answer its predecessor already gave."""
    digest = hashlib.sha256(f"{channel}\n{external_id}".encode()).hexdigest()[:24]
    return f"in.{digest}"
WITHDRAW_ATTEMPTS = 5
SETTLE_SECONDS, SETTLE_POLL = 2.0, 0.02  # waiting out a turn's start phase (milliseconds)


@dataclass(frozen=True)
class Accepted:
    conversation: Conversation
    turn_id: str
    duplicate: bool  # the message was already accepted once; turn_id is that turn
    # The message was a person's answer to an approval ("yes 1a2b3c4d"): taken, and no
    # turn made for it (`duplicate` is then True: nothing new to answer; `turn_id` is the
    # turn that waited for the approval).
    approval: str | None = None


async def submit_message(store: Store, *, channel: str, external_ids: list[str],
                         conversation_key: str, text: str, author: str | None = None,
                         owner: str | None = None, reply_to: dict[str, Any] | None = None,
                         data: dict[str, Any] | None = None,
                         scope: str | None = None, timezone: str | None = None,
                         extra: Callable[[Conversation, Writes], None] | None = None,
                         answers: str | None = None) -> Accepted:
    """`scope` says who may later see what is said here (search, memory): "private:<person>"
    for a DM, a mail thread or the terminal (the default, with `owner`), "channel:<id>" for
    a shared channel. `timezone` is the author's IANA zone if the channel knows it (a Slack
    profile's); it is stored with the turn (and the entry), so the turn's tools use it even
    when the turn is resumed after a restart. Anything not a known zone is dropped: the
    configured zone applies. `extra(conversation, writes)` adds the channel's own writes to
    the same commit (a mailbox cursor, attachments), so they land with the message or not.
    `answers`: the id that names the message itself however it was read (a Slack message's
    `<channel>:<ts>`, not the event that brought it); its answer's key derives from it
    (`answer_key`). Default: the first of `external_ids`."""
    conversation = await store.ensure_conversation(conversation_key, owner=owner, scope=scope)
    zone = known_timezone(timezone)
    w = Writes()
    inputs: dict[str, Any] = {"channel": channel, "reply_to": reply_to or {},
                              ANSWER_KEY: answer_key(channel, answers or external_ids[0])}
    if owner is not None:  # who asked: their yes is the one an approval waits for
        inputs[ASKER] = owner
    entry_data: dict[str, Any] = {"channel": channel, **(data or {})}
    if zone is not None:
        inputs[TIMEZONE] = entry_data[TIMEZONE] = zone
    taken = await _approval_answer(store, conversation, channel, external_ids, text,
                                   author, owner, entry_data, extra)
    if taken is not None:
        return taken
    turn_id = w.spawn(TURN, inputs, conversation_id=conversation.id)
    w.submit(channel, *external_ids, conversation_id=conversation.id, task_id=turn_id,
             payload={"author": author})
    w.append(conversation.id, "user", text, author=author, ref=external_ids[0],
             data=entry_data, task_id=turn_id)
    if extra is not None:
        extra(conversation, w)
    result = await store.commit(w)
    if result.duplicate:
        for external_id in external_ids:
            known = await store.submission_state(channel, external_id)
            if known and known["task_id"]:
                return Accepted(conversation, known["task_id"], True)
        return Accepted(conversation, "", True)
    return Accepted(conversation, turn_id, False)


async def _approval_answer(store: Store, conversation: Conversation, channel: str,
                           external_ids: list[str], text: str, author: str | None,
                           owner: str | None, entry_data: dict, extra) -> Accepted | None:
    """A message that answers an approval addressed to its author is taken as the answer:
    recorded (entry and submission, no turn) in the commit that applies it. Anything else
    (no such code, someone else's request, already answered) is an ordinary message."""
    found = await approval.find(store, text)
    if found is None:
        return None
    w = Writes()
    w.submit(channel, *external_ids, conversation_id=conversation.id,
             payload={"author": author, "approval": found.approval_id})
    w.append(conversation.id, "user", text, author=author, ref=external_ids[0],
             data={**entry_data, "approval": found.approval_id})
    if extra is not None:
        extra(conversation, w)
    outcome = await approval.answer(store, found.approval_id, found.approved,
                                    by=owner or "local", writes=w)
    if outcome not in ("approved", "denied"):
        return None
    turn = (await store.get_task(found.approval_id)).parent_id or ""
    return Accepted(conversation, turn, True, approval=outcome)


async def add_history(store: Store, *, channel: str, conversation_key: str,
                      messages: list[dict[str, Any]], owner: str | None = None,
                      scope: str | None = None, settled_only: bool = False) -> int:
    """Earlier messages of a conversation Steward joins late (a Slack thread it is mentioned
    in), as entries for context only: no turn. Each dict has `ref` (the channel's id for
    the message), `text`, and optionally `author`, `role` ("user" or "assistant") and
    `data`. Each ref is recorded once, forever; returns how many were new. `settled_only`:
    only while no turn of the conversation is waiting or running (the caller keeps new
    messages out meanwhile): history appended behind a message not yet answered would
    stand between it and its turn."""
    conversation = await store.ensure_conversation(conversation_key, owner=owner, scope=scope)
    if settled_only and await store.list_tasks(kind=TURN, conversation_id=conversation.id,
                                               active=True, limit=1):
        return 0
    added = 0
    for m in messages:
        w = Writes()
        w.submit(f"{channel}:history", m["ref"], conversation_id=conversation.id)
        w.append(conversation.id, m.get("role", "user"), m["text"], author=m.get("author"),
                 ref=m["ref"], data={"channel": channel, "history": True, **m.get("data", {})})
        added += not (await store.commit(w)).duplicate
    return added


def _unstarted(task: Task) -> bool:
    """A turn that has not begun: nothing read, no model called (queued or not claimed)."""
    return task.state == PENDING and task.phase == ""


async def _settled_turns(store: Store, conversation_id: int, said: list[Entry],
                         settle_by: float) -> list[Task]:
    """The conversation's active turns, once none that decides about `said` (its own, or
    an older one) is in its start phase, which takes milliseconds and ends with the turn
    queued (withdrawable) or its model call made; or as they are at `settle_by`."""
    last = max((e.task_id for e in said if e.task_id), default="")
    while True:
        turns = await store.list_tasks(kind=TURN, conversation_id=conversation_id,
                                       active=True, limit=200)
        starting = any(t.state == RUNNING and t.phase == "" and t.id <= last for t in turns)
        if not starting or time.monotonic() >= settle_by:
            return turns
        await asyncio.sleep(SETTLE_POLL)


def _withdrawable(turns: list[Task], said: list[Entry]) -> tuple[list[Entry], set[str]]:
    """Which of `said` can be taken back, and the older unstarted turns that must stay
    unstarted for that (one of them could otherwise take the message in when it starts).
    A message is answered by its own turn, or by an older turn that started after it
    arrived (its checkpoint's `upto` covers it): if that turn has begun, it stays."""
    by_id = {t.id: t for t in turns}
    picked: list[Entry] = []
    guards: set[str] = set()
    for e in said:
        own = by_id.get(e.task_id or "")
        if own is None or not _unstarted(own):
            continue
        needed, answered = set(), False
        for older in (t for t in turns if t.id < own.id):
            if _unstarted(older):  # (a retried start reads afresh: its old `upto` is moot)
                needed.add(older.id)
                continue
            upto = older.checkpoint.get("upto") if isinstance(older.checkpoint, dict) else None
            if upto is not None and upto < e.seq:
                continue  # it began before this message came: it never sees it
            answered = True  # it took the message in (or may have): it answers it
            break
        if not answered:
            picked.append(e)
            guards |= needed
    return picked, guards - {e.task_id for e in picked}


async def withdraw_message(store: Store, *, channel: str, ref: str, conversation_id: int,
                           said: list[Entry], note: str, withdrawn_note: str,
                           author: str | None = None, data: dict[str, Any] | None = None,
                           reason: str = "the message was deleted") -> list[Entry]:
    """A person took a message back (deleted it). `said` are its user entries (the
    message, and edits of it submitted as new messages). Each whose turn has not started
    yet is withdrawn: the turn ends `done` with {"withdrawn": True} without running (the
    runner never claims it, a restart never resumes it), the next queued turn is woken, and
    the context leaves the message out. All of it lands in one commit with the deletion,
    recorded like `add_history` (ref `ref`, once, forever): a note entry, `withdrawn_note`
    as a `system` entry (kept in the transcript, not shown to the model) when every one of
    `said` was withdrawn, else `note` as context for what follows. A turn that already
    started is left to run (the channel may still suppress its answer).

    Returns the withdrawn entries ([] if none was, or the deletion was recorded before)."""
    settle_by = time.monotonic() + SETTLE_SECONDS
    for attempt in range(WITHDRAW_ATTEMPTS):
        turns: list[Task] = []
        picked: list[Entry] = []
        guards: set[str] = set()
        if said and attempt < WITHDRAW_ATTEMPTS - 1:  # the last try withdraws nothing
            turns = await _settled_turns(store, conversation_id, said, settle_by)
            picked, guards = _withdrawable(turns, said)
        w = Writes()
        w.submit(f"{channel}:history", ref, conversation_id=conversation_id)
        gone = {e.task_id for e in picked}
        for e in picked:
            w.withdraw(e.task_id, {WITHDRAWN: True, "reason": reason},
                       unstarted=sorted(guards))
            nxt = next((t.id for t in turns if t.id > e.task_id and t.id not in gone), None)
            if nxt is not None:
                w.wake(nxt)  # it may sleep until the withdrawn turn ends: that is now
        everything = bool(picked) and len(picked) == len(said)
        note_data = {"channel": channel, "history": True, **(data or {})}
        if picked:
            note_data[WITHDRAWS] = sorted(e.seq for e in picked)
        w.append(conversation_id, "system" if everything else "user",
                 withdrawn_note if everything else note, author=author, ref=ref,
                 data=note_data)
        if not (await store.commit(w)).duplicate:
            return picked
        if not picked:
            return []  # recorded before
        # Dropped: a turn began meanwhile, or this deletion was recorded before: look again.
    return []
