"""What the agent's task definitions need, built once by the application wiring."""

from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from bot.agent.context import ContextCache
from bot.agent.events import Events
from bot.agent.pinned import Pinned
from bot.channels import Channel
from bot.config import Config, LLMConfig
from bot.llm.base import LLMClient
from bot.tools import ToolBox
from store import Store


@dataclass
class AgentDeps:
    store: Store
    config: Config
    client: LLMClient
    toolbox: ToolBox
    http: httpx.AsyncClient
    events: Events = field(default_factory=Events)
    channels: dict[str, Channel] = field(default_factory=dict)
    context_cache: ContextCache = field(default_factory=ContextCache)
    pinned: Pinned = field(default_factory=Pinned)  # requests of llm_calls not run yet
    wake: Callable[[], None] = lambda: None  # the runner's, once there is one
    # `[llm] fallbacks`, built: (client, its config, for its prices), tried in order.
    fallbacks: list[tuple[LLMClient, LLMConfig]] = field(default_factory=list)
    # A restored home's first hour: deliveries ask their channel first (bot/app/restore.py).
    reconcile_until: float = 0.0
