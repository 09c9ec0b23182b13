"""What the inspector reads from, opened without the runner: looking must not resume,
claim or recover a single task (a running `steward run` owns them)."""

import os
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx

from bot.app.opened import opened_store
from bot.app.wiring import build_toolbox
from bot.config import Config
from bot.llm.factory import make_client
from bot.llm.types import ToolSpec
from bot.memory import embeddings
from bot.tools.mcp.servers import McpServers
from store import Store


@dataclass
class Source:
    store: Store
    config: Config
    tools: list[ToolSpec]  # what a turn offers the model, for the exact context
    model: str


@asynccontextmanager
async def open_source(config: Config):
    """The store and, for the context page, the tools and model a turn would use (the
    same wiring as `open_app`: MCP servers are only named here, never connected)."""
    async with opened_store(config, create=False) as store, httpx.AsyncClient(
            timeout=httpx.Timeout(30.0, connect=10.0)) as http:
        client, _ = await make_client(config.llm, env=os.environ, http=http)
        embeddings.attach(store, embeddings.make(config, http))  # recall uses it, as a turn
        mcp = McpServers(config.mcp, config.secret)
        try:
            toolbox = await build_toolbox(config, mcp)
            yield Source(store, config, toolbox.specs(), client.model)
        finally:
            await mcp.close()
            embeddings.attach(store, None)
