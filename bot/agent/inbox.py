"""Accepting an inbound message: one commit stores the submission (deduplicated forever
by the channel's own ids), the user's entry and the turn that will answer it."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from store import Conversation, Store, Writes

TURN = "turn"


@dataclass(frozen=True)
class Accepted:
    conversation: Conversation
    turn_id: str
    duplicate: bool  # the message was already accepted once; turn_id is that turn


async def submit_message(store: Store, *, channel: str, external_ids: list[str],
                         conversation_key: str, text: str, author: str | None = None,
                         owner: str | None = None, reply_to: dict[str, Any] | None = None,
                         data: dict[str, Any] | None = None,
                         scope: str | None = None,
                         extra: Callable[[Conversation, Writes], None] | None = None
                         ) -> Accepted:
    """`scope` says who may later see what is said here (search, memory): "private:<person>"
    for a DM, a mail thread or the terminal (the default, with `owner`), "channel:<id>" for
    a shared channel. `extra(conversation, writes)` adds the channel's own writes to the
    same commit (a mailbox cursor, attachments), so they land with the message or not."""
    conversation = await store.ensure_conversation(conversation_key, owner=owner, scope=scope)
    w = Writes()
    turn_id = w.spawn(TURN, {"channel": channel, "reply_to": reply_to or {}},
                      conversation_id=conversation.id)
    w.submit(channel, *external_ids, conversation_id=conversation.id, task_id=turn_id,
             payload={"author": author})
    w.append(conversation.id, "user", text, author=author, ref=external_ids[0],
             data={"channel": channel, **(data or {})}, task_id=turn_id)
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


async def add_history(store: Store, *, channel: str, conversation_key: str,
                      messages: list[dict[str, Any]], owner: str | None = None,
                      scope: str | None = None) -> int:
    """Earlier messages of a conversation Steward joins late (a Slack thread it is mentioned
    in), as entries for context only: no turn. Each dict has `ref` (the channel's id for
    the message), `text`, and optionally `author`, `role` ("user" or "assistant") and
    `data`. Each ref is recorded once, forever; returns how many were new."""
    conversation = await store.ensure_conversation(conversation_key, owner=owner, scope=scope)
    added = 0
    for m in messages:
        w = Writes()
        w.submit(f"{channel}:history", m["ref"], conversation_id=conversation.id)
        w.append(conversation.id, m.get("role", "user"), m["text"], author=m.get("author"),
                 ref=m["ref"], data={"channel": channel, "history": True, **m.get("data", {})})
        added += not (await store.commit(w)).duplicate
    return added
