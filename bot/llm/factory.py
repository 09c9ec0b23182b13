"""Choose and build the LLM client from `[llm]` and the environment.

An explicit `provider` ("openai", "anthropic", "scripted") is used as configured, with
`base_url`, `model` and `api_key_env` overriding the provider's defaults. The local
presets speak the OpenAI wire to a server on this machine: "ollama" at
http://127.0.0.1:11434/v1 and "llamacpp" (llama-server) at http://127.0.0.1:8080/v1 unless
`base_url` says otherwise, with the first model the server lists unless `model` names one;
"compatible" is any such server at `base_url`. Without a provider:

1. a `base_url` alone means an OpenAI-compatible server there (llama.cpp, vLLM, ...);
2. `$OPENAI_API_KEY` set: OpenAI (gpt-4o-mini unless `model` says otherwise);
3. `$ANTHROPIC_API_KEY` set: Anthropic (claude-sonnet-4-5);
4. a local Ollama answering `GET /api/tags` within half a second: its first model
   (or `model`), through Ollama's OpenAI-compatible `/v1`;
5. the offline demo model, with a one-line banner saying so.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from bot.config import LLMConfig

from .anthropic import AnthropicClient
from .base import LLMClient
from .openai import OpenAIClient
from .scripted import demo_model

OPENAI_BASE_URL = "https://api.openai.com/v1"
OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_MODEL = "claude-sonnet-4-5"
OLLAMA_URL = "http://127.0.0.1:11434"
LLAMACPP_URL = "http://127.0.0.1:8080"
# The /v1 base URL each local preset defaults to.
LOCAL_BASE_URLS = {"ollama": f"{OLLAMA_URL}/v1", "llamacpp": f"{LLAMACPP_URL}/v1"}
OLLAMA_PROBE_SECONDS = 0.5
DEMO_BANNER = ("steward: no LLM configured; using the offline demo model. "
               "Set OPENAI_API_KEY or ANTHROPIC_API_KEY, or [llm] in config.toml.")


async def make_client(
    config_llm: LLMConfig,
    *,
    env: Mapping[str, str],
    http: httpx.AsyncClient,
    probe_ollama: bool = True,
    ollama_url: str = OLLAMA_URL,
) -> tuple[LLMClient, str | None]:
    """`(client, banner)`: the banner is a line to show the user (demo model), else None."""
    provider = config_llm.provider
    if provider == "scripted":
        return demo_model(), None
    if provider == "openai" or (provider is None and config_llm.base_url):
        return _openai(config_llm, env, http), None
    if provider == "anthropic":
        return _anthropic(config_llm, env, http), None
    if provider in ("ollama", "llamacpp", "compatible"):
        return await _local(config_llm, env, http), None
    if env.get("OPENAI_API_KEY"):
        return _openai(config_llm, env, http), None
    if env.get("ANTHROPIC_API_KEY"):
        return _anthropic(config_llm, env, http), None
    if probe_ollama:
        model = await _ollama_model(http, ollama_url)
        if model is not None:
            return OpenAIClient(http, base_url=f"{ollama_url.rstrip('/')}/v1", api_key=None,
                                model=config_llm.model or model, provider="ollama"), None
    return demo_model(), DEMO_BANNER


def _openai(config: LLMConfig, env: Mapping[str, str], http: httpx.AsyncClient) -> LLMClient:
    key_env = config.api_key_env or "OPENAI_API_KEY"
    return OpenAIClient(http, base_url=config.base_url or OPENAI_BASE_URL,
                        api_key=env.get(key_env) or None, api_key_env=key_env,
                        model=config.model or OPENAI_MODEL)


async def _local(config: LLMConfig, env: Mapping[str, str],
                 http: httpx.AsyncClient) -> LLMClient:
    """A server on this machine (or the LAN) speaking the OpenAI wire; no key unless
    `api_key_env` names one."""
    base_url = config.base_url or LOCAL_BASE_URLS[config.provider]
    model = config.model or await first_model(http, base_url, config.provider) or "default"
    return OpenAIClient(http, base_url=base_url, api_key=(
        env.get(config.api_key_env) or None) if config.api_key_env else None,
        api_key_env=config.api_key_env, model=model, provider=config.provider)


async def first_model(http: httpx.AsyncClient, base_url: str, provider: str) -> str | None:
    """The first model the server at `base_url` lists (Ollama's /api/tags, else the
    OpenAI-compatible /models), or None."""
    if provider == "ollama":
        found = await ollama_models(http, base_url.rstrip("/").removesuffix("/v1"))
        if found:
            return found[0]
    return next(iter(await listed_models(http, base_url)), None)


async def listed_models(http: httpx.AsyncClient, base_url: str) -> list[str]:
    """The model ids an OpenAI-compatible server lists at /models, or []."""
    try:
        response = await http.get(f"{base_url.rstrip('/')}/models",
                                  timeout=OLLAMA_PROBE_SECONDS * 4)
        data = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    return [str(m["id"]) for m in data if isinstance(m, dict) and m.get("id")] \
        if isinstance(data, list) else []


def _anthropic(config: LLMConfig, env: Mapping[str, str],
               http: httpx.AsyncClient) -> LLMClient:
    key_env = config.api_key_env or "ANTHROPIC_API_KEY"
    return AnthropicClient(http, base_url=config.base_url or ANTHROPIC_BASE_URL,
                           api_key=env.get(key_env) or None, api_key_env=key_env,
                           model=config.model or ANTHROPIC_MODEL)


async def ollama_models(http: httpx.AsyncClient, url: str) -> list[str]:
    """The models an Ollama at `url` lists (GET /api/tags), or [] (not running, slow, or
    none pulled)."""
    try:
        response = await http.get(f"{url.rstrip('/')}/api/tags", timeout=OLLAMA_PROBE_SECONDS)
        models = response.json().get("models") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    names = [(m.get("name") or m.get("model")) if isinstance(m, dict) else None
             for m in (models if isinstance(models, list) else [])]
    return [str(n) for n in names if n]


async def _ollama_model(http: httpx.AsyncClient, url: str) -> str | None:
    """The first model a local Ollama lists, or None."""
    return next(iter(await ollama_models(http, url)), None)
