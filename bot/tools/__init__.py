"""Tools the agent calls: typed async functions with a JSON schema and a replay policy."""

from bot.tools.base import (
    Tool,
    ToolBox,
    ToolContext,
    ToolModuleError,
    ToolResult,
    tool,
)
from bot.tools.builtin import builtin_tools

__all__ = ["Tool", "ToolBox", "ToolContext", "ToolModuleError", "ToolResult", "builtin_tools",
           "tool"]
