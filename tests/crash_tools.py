"""Tools for the agent crash tests, loaded by a real `steward` process through
`[agent] tool_modules`. Each execution appends a line to the file named by
$STEWARD_TEST_LEDGER: the outside world's count of what really ran."""

import asyncio
import os
import signal

from bot.runtime import Policy
from bot.runtime.killpoints import kill_point
from bot.tools import ToolContext, tool


def _note(line: str) -> None:
    with open(os.environ["STEWARD_TEST_LEDGER"], "a") as f:
        f.write(line + "\n")


@tool(policy=Policy.SAFE)
async def safe_probe(ctx: ToolContext, target: str) -> str:
    """Look at something without changing it."""
    await asyncio.to_thread(_note, f"safe_probe {ctx.task_id}")
    kill_point("in-tool", "safe_probe")
    return f"{target} looks fine"


@tool
async def unsafe_charge(ctx: ToolContext, amount: int) -> str:
    """Charge the card (not safe to repeat)."""
    await ctx.save_partial(f"charging {amount}")
    await asyncio.to_thread(_note, f"unsafe_charge {ctx.task_id}")
    kill_point("in-tool", "unsafe_charge")
    return f"charged {amount}"


@tool(policy=Policy.SAFE)
async def crash_now(ctx: ToolContext, what: str) -> str:
    """A poison: kills the process each time it runs."""
    await asyncio.to_thread(_note, f"crash_now {ctx.task_id}")
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"
