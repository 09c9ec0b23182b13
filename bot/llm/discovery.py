"""What a model server says about its model: the context size and whether its chat template
can take tools. A configured `context_window` is only a guess; a local server knows.

Asked where each server says it, cheapest first, each with a short time limit:

* llama.cpp `GET /props`: `n_ctx` (newer builds at the top level too, older ones only in
  `default_generation_settings`), `chat_template_caps.supports_tools` (newer builds),
  else whether `chat_template` mentions tools at all;
* Ollama `POST /api/show`: `parameters` (`num_ctx` set in the Modelfile), the model's own
  `model_info["<arch>.context_length"]`, `capabilities` ("tools"); `GET /api/ps` gives the
  context the loaded model really runs with. Ollama cuts a longer prompt silently (no
  error to learn from), so without either it counts on its default, 4096 tokens;
* an OpenAI-compatible `GET /models` entry that carries it: llama.cpp's `meta.n_ctx`,
  vLLM's `max_model_len`, OpenRouter's and LM Studio's `context_length`;
* afterwards, an overflow error's own words (`from_overflow`): llama.cpp answers HTTP
  400 with `n_ctx` in the body and "request (N tokens) exceeds the available context
  size (2048 tokens)" in the message.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

PROBE_SECONDS = 2.0
OLLAMA_DEFAULT_CONTEXT = 4096  # what Ollama runs a model with unless told (< 24 GB VRAM)
KINDS = ("llamacpp", "ollama", "compatible")


@dataclass(frozen=True)
class ModelFacts:
    """What was learned: the context size in tokens and whether tools reach the model
    (None: not said), and where it was read ("llama.cpp /props", ...)."""

    context_tokens: int | None = None
    tools: bool | None = None
    source: str = ""
    models: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.context_tokens is not None or self.tools is not None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and value > 0:
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value) or None
    return None


# -- the answers, read -------------------------------------------------------------------


def from_props(props: Any) -> ModelFacts:
    """llama.cpp's /props."""
    if not isinstance(props, dict):
        return ModelFacts()
    settings = props.get("default_generation_settings")
    n_ctx = _int(props.get("n_ctx")) or _int((settings or {}).get("n_ctx")
                                               if isinstance(settings, dict) else None)
    caps = props.get("chat_template_caps")
    tools = None
    if isinstance(caps, dict) and "supports_tools" in caps:
        tools = bool(caps.get("supports_tools")) and bool(caps.get("supports_tool_calls", True))
    elif isinstance(props.get("chat_template"), str) and props["chat_template"]:
        tools = "tools" in props["chat_template"] or "tool_call" in props["chat_template"]
    return ModelFacts(n_ctx, tools, "llama.cpp /props")


def from_show(show: Any, running: int | None = None) -> ModelFacts:
    """Ollama's /api/show (and the context of the loaded model from /api/ps, if any)."""
    if not isinstance(show, dict):
        return ModelFacts()
    num_ctx = None
    for line in str(show.get("parameters") or "").splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "num_ctx":
            num_ctx = _int(value.strip())
    info = show.get("model_info") if isinstance(show.get("model_info"), dict) else {}
    trained = next((_int(v) for k, v in info.items() if k.endswith(".context_length")), None)
    context = running or num_ctx or min(trained or OLLAMA_DEFAULT_CONTEXT,
                                        OLLAMA_DEFAULT_CONTEXT)
    capabilities = show.get("capabilities")
    if isinstance(capabilities, list):
        tools = "tools" in capabilities
    elif isinstance(show.get("template"), str):
        tools = ".Tools" in show["template"]
    else:
        tools = None
    where = "Ollama /api/ps" if running else "Ollama /api/show"
    return ModelFacts(context, tools, where)


def from_models(listing: Any, model: str) -> ModelFacts:
    """An OpenAI-compatible /models listing: the entry for `model` (or the only one), if it
    carries its context size."""
    data = listing.get("data") if isinstance(listing, dict) else None
    entries = [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []
    names = tuple(str(e.get("id")) for e in entries if e.get("id"))
    entry = next((e for e in entries if e.get("id") == model), None)
    if entry is None and len(entries) == 1:
        entry = entries[0]
    if entry is None:
        return ModelFacts(models=names)
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    context = (_int(meta.get("n_ctx")) or _int(entry.get("max_model_len"))
               or _int(entry.get("context_length")) or _int(entry.get("max_context_length"))
               or _int((entry.get("top_provider") or {}).get("context_length")
                       if isinstance(entry.get("top_provider"), dict) else None)
               or _int(meta.get("n_ctx_train")))
    return ModelFacts(context, None, "/models" if context else "", names)


_SAID = [
    re.compile(r"exceeds the available context size \((\d+) tokens\)", re.IGNORECASE),
    re.compile(r"larger than the max context size \((\d+) tokens\)", re.IGNORECASE),
    re.compile(r"maximum context length is (\d+) tokens", re.IGNORECASE),  # OpenAI, vLLM
    re.compile(r"context (?:window|length|size)(?: of| is)? (\d+)(?: tokens)?", re.IGNORECASE),
    re.compile(r"n_ctx[\"']?\s*[:=]\s*(\d+)"),
]


def from_overflow(body: str, message: str = "") -> int | None:
    """The context size an overflow error states, or None: llama.cpp's `n_ctx` in the
    body, else the number its (or vLLM's, OpenAI's) message gives."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    error = data.get("error", data) if isinstance(data, dict) else None
    if isinstance(error, dict) and (n := _int(error.get("n_ctx"))):
        return n
    for text in (message, body):
        for pattern in _SAID:
            if text and (found := pattern.search(text)):
                return _int(found.group(1))
    return None


# -- asking ------------------------------------------------------------------------------


def server_root(base_url: str) -> str:
    """The server's own root for its native endpoints: the /v1 URL without /v1."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


async def _get(http: httpx.AsyncClient, method: str, url: str, **kw) -> Any:
    try:
        response = await http.request(method, url, timeout=PROBE_SECONDS, **kw)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def discover(http: httpx.AsyncClient, base_url: str, model: str,
                   kind: str = "compatible") -> ModelFacts:
    """Ask the server at `base_url` (an OpenAI-compatible /v1 URL) about `model`. `kind`:
    "llamacpp", "ollama", or "compatible" (try each way). Nothing answering is
    `ModelFacts()` (falsy): the caller keeps what it knew."""
    root = server_root(base_url)
    if kind in ("llamacpp", "compatible"):
        facts = from_props(await _get(http, "GET", f"{root}/props"))
        if facts.context_tokens:
            listed = from_models(await _get(http, "GET", f"{base_url.rstrip('/')}/models"),
                                 model)
            return ModelFacts(facts.context_tokens, facts.tools, facts.source, listed.models)
    if kind in ("ollama", "compatible") and model:
        show = await _get(http, "POST", f"{root}/api/show", json={"model": model})
        if isinstance(show, dict) and (show.get("model_info") or show.get("parameters")):
            ps = await _get(http, "GET", f"{root}/api/ps")
            running = next((_int(m.get("context_length")) for m in (ps or {}).get("models", [])
                            if isinstance(m, dict) and model in (m.get("name"), m.get("model"))),
                           None) if isinstance(ps, dict) else None
            return from_show(show, running)
    return from_models(await _get(http, "GET", f"{base_url.rstrip('/')}/models"), model)
