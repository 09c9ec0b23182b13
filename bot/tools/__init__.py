"""Tools the agent calls: typed async functions with a JSON schema and a replay policy.

The names below load on first use: `bot.config` reads `bot.tools.mcp.config`, and loading
the config must not load the tools, the runtime and the store (every command starts so)."""

from importlib import import_module

_HOMES = {"Tool": "base", "ToolBox": "base", "ToolContext": "base",
          "ToolModuleError": "base", "ToolResult": "base", "known_timezone": "base",
          "tool": "base", "builtin_tools": "builtin"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'bot.tools' has no attribute {name!r}")
    value = getattr(import_module(f"bot.tools.{_HOMES[name]}"), name)
    globals()[name] = value  # once: later lookups skip this function
    return value
