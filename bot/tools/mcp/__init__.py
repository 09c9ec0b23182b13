"""Tools from Model Context Protocol servers: `[[mcp.servers]]` in the config, each started
(stdio) or reached (streamable HTTP) and kept up by `McpServers`, offered to the model as
two tools (`mcp_tools`, `mcp_call`) so that a server's many tools cost the prompt one line.
The SDK is imported only when a server is configured."""

from bot.tools.mcp.config import McpConfig, McpServerConfig

__all__ = ["McpConfig", "McpServerConfig"]
