"""The checkpoints of an agent turn (bot/agent/turn.py), version 1: the fields the release
before typed kinds (7338092) wrote, which this one still writes the same way.

One turn's checkpoint grows as it goes: what every phase after the first keeps
(`TurnCheckpoint`), plus the LLM call it waits for (`AfterLLM`), the tool calls it waits
for (`AfterTools`) or the answer it delivers (`Delivered`).
"""

from bot.runtime.kinds import Checkpoint


class NotRun(Checkpoint):
    """A tool call answered with its error instead of running (bot/agent/call_check.py)."""

    call: dict
    error: str


class TurnCheckpoint(Checkpoint):
    upto: int  # the last entry of the conversation this turn answers
    round: int  # tool rounds so far
    llm_task: str | None = None  # the latest LLM call
    compacted: bool = False  # waited for a summary already (once per turn)
    overflow_retried: bool = False  # the provider said "too long" once already
    without_tools: bool = False  # asked again without the tools' schemas
    read_outside: str | None = None  # what outside text the turn has read (provenance)
    notes: list[str] = []  # said with the answer: what the model did not see
    note: str | None = None  # near a spending cap: said once, with the answer
    # Only where a try failed after the calls were made (or a quarantined turn's answer):
    # the round's calls, which the phase makes again or no longer needs.
    tool_tasks: list[str | NotRun] | None = None


class AfterLLM(TurnCheckpoint):
    llm_task: str


class AfterTools(AfterLLM):
    tool_tasks: list[str | NotRun]  # a task id per call, in call order


class Delivered(TurnCheckpoint):
    answer: str
    delivery: str | None
