"""Messages in the plain shape every chat template takes: one system message first, then
user and assistant strictly in turn, starting with the user, with text only.

Strict templates (Gemma's, and others rendered by llama.cpp, vLLM or LM Studio) raise
"Conversation roles must alternate user/assistant/..." for anything else: a `system` note
in the middle (the recall note goes before the newest message), two user messages in a
row (follow-ups), a `tool` message, or several tool results after one call. Some servers
also fail to parse a tool call in the history. So, in this shape:

* a later system note is folded into the user turn it stands before (or, with none after
  it, into the one it follows);
* an assistant's tool calls become lines of its text, and each tool result a line of the
  next user turn, so the model still reads what it did and what came of it;
* neighbours of one role are merged (text joined by a blank line, images kept in order).
"""

from __future__ import annotations

import json

from .types import Message

RESULT_CHARS = 4000  # characters of one tool result kept in its line


def alternating(messages: list[Message]) -> list[Message]:
    """`messages` in the plain, strictly alternating shape (see the module doc)."""
    system = [m.content for m in messages[:1] if m.role == "system"]
    rest = messages[len(system):]
    turns: list[Message] = []
    held: list[str] = []  # system notes waiting for the next user turn
    for m in rest:
        if m.role == "system":
            held.append(m.content)
            continue
        plain = _plain(m)
        if plain.role == "user" and held:
            plain = plain.model_copy(update={"content": _join(*held, plain.content)})
            held = []
        _add(turns, plain)
    if held:  # notes after the last user turn: they belong with it
        _add(turns, Message(role="user", content=_join(*held)))
    if not turns or turns[0].role != "user":
        turns.insert(0, Message(role="user", content="(the conversation so far)"))
    head = [Message(role="system", content=system[0])] if system else []
    return head + turns


def _plain(m: Message) -> Message:
    """One message as user or assistant text."""
    if m.role == "tool":
        text = m.content if len(m.content) <= RESULT_CHARS else \
            m.content[:RESULT_CHARS] + f" [... {len(m.content) - RESULT_CHARS:,} more characters]"
        how = "failed" if m.is_error else "returned"
        return Message(role="user", content=f"[tool {m.name or 'call'} {how}: {text}]")
    if m.role == "assistant" and m.tool_calls:
        lines = [f"[I called the tool {c.name} with "
                 f"{json.dumps(_shown(c.arguments), ensure_ascii=False)}]"
                 for c in m.tool_calls]
        return Message(role="assistant", content=_join(m.content, *lines))
    return Message(role=m.role, content=m.content, images=list(m.images))


def _shown(arguments: dict) -> dict:
    return {} if set(arguments) == {"_raw"} else arguments


def _add(turns: list[Message], m: Message) -> None:
    if turns and turns[-1].role == m.role:
        last = turns[-1]
        turns[-1] = last.model_copy(update={"content": _join(last.content, m.content),
                                            "images": [*last.images, *m.images]})
    else:
        turns.append(m)


def _join(*parts: str) -> str:
    return "\n\n".join(p for p in parts if p)
