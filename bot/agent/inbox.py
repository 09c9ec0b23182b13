"""Accepting an inbound message: one commit stores the submission (deduplicated forever
by the channel's own ids), the user's entry and the turn that will answer it."""

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
                         data: dict[str, Any] | None = None) -> Accepted:
    conversation = await store.ensure_conversation(conversation_key, owner=owner)
    w = Writes()
    turn_id = w.spawn(TURN, {"channel": channel, "reply_to": reply_to or {}},
                      conversation_id=conversation.id)
    w.submit(channel, *external_ids, conversation_id=conversation.id, task_id=turn_id,
             payload={"author": author})
    w.append(conversation.id, "user", text, author=author, ref=external_ids[0],
             data={"channel": channel, **(data or {})}, task_id=turn_id)
    result = await store.commit(w)
    if result.duplicate:
        for external_id in external_ids:
            known = await store.submission_state(channel, external_id)
            if known and known["task_id"]:
                return Accepted(conversation, known["task_id"], True)
        return Accepted(conversation, "", True)
    return Accepted(conversation, turn_id, False)
