"""The `[mcp]` section: which MCP servers Steward uses, and how far it trusts their tools.

    [[mcp.servers]]
    name = "files"                       # how the model names it (letters, digits, _ -)
    description = "the shared drive"     # one line in the model's index of servers
    command = "npx"                      # stdio: a program Steward starts and keeps up
    args = ["-y", "@modelcontextprotocol/server-filesystem", "/srv/share"]
    env = { LOG_LEVEL = "warn" }         # extra environment, literal values
    pass_env = ["DRIVE_TOKEN"]           # environment variables passed through (secrets)
    policy = "unsafe"                    # replay policy of its tools: unsafe (default),
    tools = { read_file = "safe" }       #   safe or keyed; per tool where they differ
    trusted = ["read_file"]              # may run unasked after outside text ("*": all)

    [[mcp.servers]]
    name = "tracker"
    url = "https://tracker.example/mcp"  # streamable HTTP
    headers = { "X-Team" = "home" }       # literal headers
    headers_env = { Authorization = "TRACKER_AUTH" }  # header -> env var holding its value

A tool nobody declared is `unsafe`: after a crash mid-call it is reported as interrupted,
never called again blindly, and it asks the person first like an unsafe custom tool
(`[agent] approve_unsafe_custom_tools`).

Replay is not trust: `safe` says a call may be repeated after a crash, nothing about what
it sends where. Once a turn's request holds text from outside (bot/provenance.py), every
MCP call waits for the person's yes unless the owner named the tool in `trusted` (they
vouch it sends nothing anywhere that matters); an address anywhere in a call's arguments
is fetched unasked only if the person wrote it, whatever the tool.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PolicyName = Literal["safe", "keyed", "unsafe"]
_NAME = re.compile(r"[A-Za-z0-9_-]{1,32}")
_ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class McpServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str
    description: str = ""
    command: str = ""
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[str] = Field(default_factory=list)
    url: str = ""
    headers: dict[str, str] = Field(default_factory=dict)  # literal values
    headers_env: dict[str, str] = Field(default_factory=dict)  # header -> env var
    policy: PolicyName = "unsafe"
    tools: dict[str, PolicyName] = Field(default_factory=dict)
    trusted: list[str] = Field(default_factory=list)  # tool names, or "*" for all
    call_timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    connect_timeout_seconds: float = Field(default=20.0, gt=0, le=600)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError("must be 1-32 letters, digits, _ or -")
        return name

    @field_validator("pass_env")
    @classmethod
    def _env_names(cls, names: list[str]) -> list[str]:
        bad = [n for n in names if not _ENV.fullmatch(n)]
        if bad:
            raise ValueError(f"not environment variable names: {', '.join(bad)}")
        return names

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        if url and not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return url

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if bool(self.command) == bool(self.url):
            raise ValueError(f"server {self.name!r}: give either command (stdio) or url "
                             "(streamable HTTP)")
        if self.url and (self.args or self.env or self.pass_env):
            raise ValueError(f"server {self.name!r}: args, env and pass_env are for "
                             "command servers")
        if self.command and (self.headers or self.headers_env):
            raise ValueError(f"server {self.name!r}: headers and headers_env are for url "
                             "servers")
        return self

    def policy_of(self, tool: str) -> PolicyName:
        return self.tools.get(tool, self.policy)

    def trusts(self, tool: str) -> bool:
        """Whether the owner lets `tool` run unasked after outside text."""
        return "*" in self.trusted or tool in self.trusted


class McpConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    servers: list[McpServerConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> McpConfig:
        names = [s.name for s in self.servers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"server names used twice: {', '.join(twice)}")
        return self
