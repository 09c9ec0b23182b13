"""A deterministic stand-in for an embeddings provider, served over real HTTP: tests and
bench/recall.py point the real `OpenAIEmbedder` at it (127.0.0.1, port 0) and count what
it receives. Not a model: a hashed bag of crudely stemmed words, so texts that share words
are near and others are not.

    async with FakeEmbeddings() as fake:   # fake.base_url, fake.requests, fake.texts
        fake.fail_next(503, times=2)        # the next two requests answer 503
"""

import hashlib
import math
import re

from aiohttp import web

__all__ = ["FakeEmbeddings", "hashed_embedding"]

__test__ = False

DIMENSIONS = 256
_WORD = re.compile(r"\w+")
_STOP = frozenset("a an the and or of to in on at is are was were i you he she it we they "
                  "my your me did do does what when who where how with for".split())


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[:-len(suffix)]
    return word


def hashed_embedding(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """Unit vector of hashed word counts (each word to a signed bucket)."""
    v = [0.0] * dimensions
    for word in _WORD.findall(text.casefold()):
        if word in _STOP:
            continue
        h = hashlib.blake2b(_stem(word).encode(), digest_size=8).digest()
        n = int.from_bytes(h, "little")
        v[n % dimensions] += 1.0 if (n >> 32) & 1 else -1.0
    norm = math.sqrt(sum(x * x for x in v)) or 1.0
    return [x / norm for x in v]


class FakeEmbeddings:
    def __init__(self, *, model: str = "fake-hash-256", dimensions: int = DIMENSIONS):
        self.model, self.dimensions = model, dimensions
        self.requests = 0
        self.texts: list[str] = []
        self._failures: list[int] = []
        self.refuse: set[str] = set()  # an input containing one of these answers 400
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    def fail_next(self, status: int, times: int = 1) -> None:
        self._failures += [status] * times

    async def _embeddings(self, request: web.Request) -> web.Response:
        self.requests += 1
        if self._failures:
            return web.json_response({"error": {"message": "injected"}},
                                     status=self._failures.pop(0))
        body = await request.json()
        inputs = body.get("input")
        inputs = [inputs] if isinstance(inputs, str) else inputs
        if not isinstance(inputs, list) or not all(isinstance(t, str) for t in inputs):
            return web.json_response({"error": {"message": "input"}}, status=400)
        if any(word in t for t in inputs for word in self.refuse):
            return web.json_response({"error": {"message": "refused"}}, status=400)
        self.texts += inputs
        return web.json_response({
            "object": "list", "model": body.get("model", self.model),
            "data": [{"object": "embedding", "index": i,
                      "embedding": hashed_embedding(t, self.dimensions)}
                     for i, t in enumerate(inputs)],
            "usage": {"prompt_tokens": 0, "total_tokens": 0}})

    async def __aenter__(self) -> "FakeEmbeddings":
        app = web.Application()
        app.router.add_post("/v1/embeddings", self._embeddings)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
