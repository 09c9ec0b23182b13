"""A model's tool calls, checked before any of them runs.

A weak model's output, turned into tool calls by its server, can be anything: fifteen calls
at once, names no tool has, arguments that are not JSON, the last call cut off where the
reply hit its length limit. None of that may run, and none of it may be stored in a form
that a server cannot read back: the calls of every reply are sent again with each later
request of the conversation, and a server that cannot parse one (llama.cpp answers with a
500) would refuse the conversation for good.

So every call gets a verdict: run it, or answer it with an error (the tool result the model
reads, saying what was wrong). The call is stored normalized: a usable name, an id unique
in the reply, and arguments that are a JSON object (`{}` for ones that were not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from bot.llm.types import Response, ToolCall
from bot.tools import ToolBox

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # what every provider accepts back
NO_NAME = "invalid_call"


@dataclass(frozen=True)
class Checked:
    call: ToolCall  # as stored and sent back to the model
    problem: str | None  # why it is not run (its error result), or None: run it


def check_calls(response: Response, toolbox: ToolBox, *, most: int) -> list[Checked]:
    """A verdict for each of `response`'s tool calls, in order; `most`: calls allowed in
    one reply (with more, none runs: so many at once is a garbled reply, not a plan)."""
    calls = _normalized(response.tool_calls)
    cut = len(calls) - 1 if response.stop_reason == "length" else None
    too_many = len(calls) > most
    checked = []
    for n, (call, original) in enumerate(zip(calls, response.tool_calls, strict=True)):
        if too_many:
            problem = (f"error: not run: this reply made {len(calls)} tool calls, more than "
                       f"the {most} allowed in one reply, so none of them ran. Make at most "
                       f"{most} calls at a time.")
        elif n == cut:
            problem = ("error: not run: this call was cut off where the reply reached its "
                       "length limit, before its arguments were complete. Make it again, "
                       "shorter if it was long.")
        else:
            problem = _problem(original, toolbox)
        checked.append(Checked(call, problem))
    return checked


def _problem(call: ToolCall, toolbox: ToolBox) -> str | None:
    tool = toolbox.get(call.name)
    if tool is None:
        known = ", ".join(toolbox.names())
        return f"error: not run: there is no tool named {call.name[:80]!r} (tools: {known})."
    problem = tool.problem(call.arguments)
    return None if problem is None else f"{problem} (not run)"


def _normalized(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls in a form any server reads back: a valid name, ids unique in the reply,
    arguments a JSON object (`{}` in place of text that was not one)."""
    seen: set[str] = set()
    out = []
    for n, call in enumerate(calls):
        call_id = call.id if call.id and len(call.id) <= 64 else f"call_{n}"
        while call_id in seen:
            call_id = f"{call_id}_{n}"
        seen.add(call_id)
        arguments = {} if set(call.arguments) == {"_raw"} else call.arguments
        name = call.name if _NAME.match(call.name) else NO_NAME
        out.append(ToolCall(id=call_id, name=name, arguments=arguments))
    return out
