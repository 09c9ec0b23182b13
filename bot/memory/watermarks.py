"""When compaction starts and how far it goes, scaled to the model's window.

The defaults (`reserve_tokens` 16000, `keep_recent_tokens` 20000, a summary of up to 1500
words) are for a 128k window. At 8k they meant a compaction task on every turn that never
wrote a summary: the history was always "near the limit", and never more than what it
had to keep. Here every size is a share of the room the history has (the window less
the reply's room and the fixed part: system prompt, facts, tool schemas), with
hysteresis: a compaction starts once the history passes the high-water mark (`high`) and
keeps only `keep` tokens of it verbatim, so with its summary the history drops to about
half the room and grows for a while before the next one. A value set in the file is kept
where it fits the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.config import CompactionConfig, LLMConfig

MAX_SUMMARY_TOKENS = 2000  # about 1500 words
MIN_SUMMARY_TOKENS = 64
MIN_ROOM = 256


@dataclass(frozen=True)
class Marks:
    limit: int  # tokens a request may hold: the window less the reply's room
    room: int  # of those, what history and its summary may take
    high: int  # history past this starts a compaction (in the background)
    keep: int  # tokens of the newest history a compaction leaves verbatim
    summary: int  # tokens a summary may take

    @property
    def summary_words(self) -> int:
        return max(40, self.summary * 3 // 4)


def marks(llm: LLMConfig, compaction: CompactionConfig, fixed_tokens: int) -> Marks:
    """The marks for a request whose fixed part is `fixed_tokens`."""
    limit = llm.window - llm.output_tokens
    room = max(limit - fixed_tokens, MIN_ROOM)
    summary = max(MIN_SUMMARY_TOKENS, min(MAX_SUMMARY_TOKENS, room // 6))
    chosen = compaction.model_fields_set
    reserve = compaction.reserve_tokens
    if reserve > room // (2 if "reserve_tokens" in chosen else 4):
        reserve = room // 8
    high = room - reserve
    keep = compaction.keep_recent_tokens
    fits = high - room // 8 if "keep_recent_tokens" in chosen else room // 2
    if keep + summary > fits:
        keep = max(0, room // 2 - summary)
    return Marks(limit, room, high, keep, summary)
