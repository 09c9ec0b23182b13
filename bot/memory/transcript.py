"""The transcript as the agent reads it: which entries the model sees, their size, the
head marker of the latest compaction, the messages a note says were taken back, and the
tokens a character costs in this conversation. Shared by context assembly (bot/agent) and
compaction's cut (bot/memory/compaction.py)."""

from bot.provenance import Marked, of_entry
from store import Conversation, Entry, Store

PAGE = 100
SPOKEN = ("user", "assistant", "tool_result")  # what the model sees; `aborted` etc. are not
WITHDRAWS = "withdraws"  # a note's data: positions of messages taken back (bot.agent.inbox)
CHARS_PER_TOKEN = 3  # before the provider has reported any usage: errs on the large side


def entry_chars(entry: Entry) -> int:
    return len(entry.text) + 200 * len((entry.data or {}).get("tool_calls", []))


async def head_of(store: Store, conversation: Conversation) -> tuple[str | None, int]:
    """(summary, cut) from the conversation's head marker, or (None, 0). The summary keeps
    its mark (`Marked`): what it summarised was outside text in part."""
    if not conversation.head_seq:
        return None, 0
    [marker] = await store.entries_page(conversation.id, after=conversation.head_seq - 1,
                                        limit=1)
    return (Marked(marker.text, of_entry(marker)),
            int((marker.data or {}).get("cut_seq", marker.seq)))


WITHDRAWN = "withdrawn"  # a withdrawn turn's result: {"withdrawn": True, "reason": ...}


def withdrawn_by(entry: Entry) -> list[int]:
    """The positions of the messages this entry says were taken back before they were
    answered (a deleted question): they are left out of the model's context. The note
    always comes after them."""
    return list((entry.data or {}).get(WITHDRAWS) or ())


async def tokens_per_char(store: Store, conversation_id: int) -> float:
    """From the provider's last reported usage in this conversation: its input tokens over
    the characters of the request that produced them."""
    result = await store.last_result(kind="llm_call", conversation_id=conversation_id)
    if isinstance(result, dict) and result.get("request_chars"):
        usage = (result.get("response") or {}).get("usage") or {}
        if usage.get("input_tokens"):
            return usage["input_tokens"] / result["request_chars"]
    return 1 / CHARS_PER_TOKEN
