"""Tools the agent calls: typed async functions with a JSON schema and a replay policy."""

from bot.tools.base import (
    Tool,
    ToolBox,
    ToolContext,
    ToolModuleError,
    ToolResult,
    known_timezone,
    tool,
)
from bot.tools.builtin import builtin_tools

__all__ = ["Tool", "ToolBox", "ToolContext", "ToolModuleError", "ToolResult", "builtin_tools",
           "known_timezone", "tool"]
