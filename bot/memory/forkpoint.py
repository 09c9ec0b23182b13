"""Where a conversation may be forked: at a position where no exchange is open — no tool
call waits for its result and no question for its answer (`compaction.open_at`, the rule
a compaction cut follows too).

A fork inside an exchange inherits half of it: a call whose result never comes, or a
question whose turn will never answer in the fork. The model then sees a call without a
result, or its next turn is ordered behind the question that never gets answered. So a
fork point inside one moves to the nearest position outside, and the caller says so."""

from dataclasses import dataclass

from bot.memory.compaction import open_at
from store import Store

LOOK_AHEAD = 500  # positions after the one asked for searched for the end of its exchange


@dataclass(frozen=True)
class ForkPoint:
    at: int  # where the fork is made
    asked: int  # the position asked for
    why: str | None = None  # what was open at `asked`; None when it was safe

    @property
    def moved(self) -> bool:
        return self.at != self.asked


async def _open(store: Store, conversation_id: int, seq: int) -> int | None:
    return None if seq == 0 else await open_at(store, conversation_id, seq, 0)


async def safe_fork_point(store: Store, conversation_id: int, asked: int,
                          last_seq: int) -> ForkPoint:
    """`asked` if nothing is open there; else the nearest position before or after it
    where nothing is (on a tie, the later one: it keeps what was pointed at)."""
    oldest = await _open(store, conversation_id, asked)
    if oldest is None:
        return ForkPoint(asked, asked)
    why = await _what_is_open(store, conversation_id, oldest)
    # Everything from the oldest open thing up to `asked` is inside the exchange too.
    before = oldest - 1
    while (problem := await _open(store, conversation_id, before)) is not None:
        before = problem - 1
    after = None
    for seq in range(asked + 1, min(last_seq, asked + LOOK_AHEAD) + 1):
        if await _open(store, conversation_id, seq) is None:
            after = seq
            break
    at = after if after is not None and after - asked <= asked - before else before
    return ForkPoint(at, asked, why)


async def _what_is_open(store: Store, conversation_id: int, seq: int) -> str:
    page = await store.entries_page(conversation_id, after=seq - 1, limit=1)
    entry = page[0] if page else None
    if entry is not None and entry.kind == "assistant":
        return f"a tool call at entry {seq} has no result by then"
    return f"a question at entry {seq} has no answer by then"
