"""Embeddings: the OpenAI-compatible client against a real HTTP server on 127.0.0.1 (the
deterministic stand-in provider, tests/fakes/embedding_server.py), the durable background
task that embeds every searchable entry (outages, refusals, repeats), and the hybrid search,
which stays inside the asker's scope. Store tests run on SQLite and PostgreSQL."""

import httpx
import pytest
from sqlalchemy import text

from bot.memory.embedding_task import EMBED, EmbedEntries, ensure_embedding
from bot.memory.embeddings import EmbeddingRejected, EmbeddingUnavailable, OpenAIEmbedder
from bot.memory.search import remember
from bot.runtime import Registry, Runner, RunnerOptions
from store import Writes
from store import vectors as _vectors
from tests.fakes.embedding_server import FakeEmbeddings, hashed_embedding

OPTIONS = RunnerOptions(concurrency=2, lease_seconds=10, poll_seconds=0.02,
                        retry_base_seconds=0.01, retry_max_seconds=0.05)


@pytest.fixture
async def provider():
    async with FakeEmbeddings() as fake, httpx.AsyncClient() as http:
        yield fake, OpenAIEmbedder(http, base_url=fake.base_url, model=fake.model,
                                   hybrid=True, batch_size=4)


async def test_the_client_speaks_the_openai_embeddings_api(provider):
    fake, embedder = provider
    vectors = await embedder.embed(["the climbing gym", "a puppy named Biscuit"])
    assert fake.requests == 1 and fake.texts == ["the climbing gym", "a puppy named Biscuit"]
    assert vectors[0] == pytest.approx(hashed_embedding("the climbing gym"))
    assert len(vectors[1]) == 256
    fake.fail_next(503)
    with pytest.raises(EmbeddingUnavailable) as down:
        await embedder.embed(["x"])
    assert down.value.status == 503
    fake.refuse.add("forbidden")
    with pytest.raises(EmbeddingRejected):
        await embedder.embed(["a forbidden text"])
    gone = OpenAIEmbedder(embedder.http, base_url="http://127.0.0.1:9/v1", model="m")
    with pytest.raises(EmbeddingUnavailable):
        await gone.embed(["x"])


async def said(store, key, rows, *, owner="me", scope=None, kind="user"):
    conv = await store.ensure_conversation(key, owner=owner, scope=scope)
    w = Writes()
    for author, body in rows:
        w.append(conv.id, kind, body, author=author)
    await store.commit(w)
    return conv


async def vector_rows(store):
    async with store.engines.read.connect() as conn:
        return (await conn.execute(text(
            "SELECT entry_id, vec IS NULL FROM entry_vectors ORDER BY entry_id"))).all()


async def searchable_ids(store):
    async with store.engines.read.connect() as conn:
        return [r[0] for r in await conn.execute(text(
            "SELECT id FROM entries WHERE kind IN ('user', 'assistant', 'tool_result', "
            "'compaction') AND text != '' ORDER BY id"))]


async def embed_until_idle(store, embedder, **kw):
    runner = Runner(store, Registry(EmbedEntries(store, embedder, **kw)), OPTIONS)
    await ensure_embedding(store, embedder)
    await runner.run(until_idle=True, horizon=0.5)


async def test_every_searchable_entry_is_embedded_once_in_batches(store, provider):
    fake, embedder = provider
    await said(store, "cli:a", [("Anna", f"message number {i}") for i in range(10)])
    conv = await said(store, "cli:b", [("Bob", "")])  # nothing to embed
    w = Writes()
    w.append(conv.id, "system", "not searchable")
    await store.commit(w)
    await embed_until_idle(store, embedder)
    rows = await vector_rows(store)
    assert [r[0] for r in rows] == await searchable_ids(store) and len(rows) == 10
    assert fake.requests == 3  # batches of 4
    assert "Anna: message number 0" in fake.texts  # with the speaker's name
    # a second app start finds the task still there (sleeping): one task, nothing redone
    await ensure_embedding(store, embedder)
    assert len(await store.list_tasks(kind=EMBED)) == 1
    # new entries (an import, a live turn) are picked up by the same task
    await said(store, "cli:a", [("Anna", "one more")])
    task = (await store.list_tasks(kind=EMBED))[0]
    async with store.engines.write.begin() as conn:  # its sleep is over
        await conn.execute(text("UPDATE tasks SET run_after = 0 WHERE id = :i"), {"i": task.id})
    await embed_until_idle(store, embedder)
    assert len(await vector_rows(store)) == 11 and fake.requests == 4


async def test_an_outage_delays_embedding_and_a_refusal_is_recorded_once(store, provider):
    fake, embedder = provider
    await said(store, "cli:a", [("Anna", "fine text"), ("Anna", "a forbidden text"),
                                ("Anna", "more fine text")])
    fake.fail_next(503, times=3)
    fake.refuse.add("forbidden")
    await embed_until_idle(store, embedder, backoff=(0.01, 0.05))
    rows = await vector_rows(store)
    assert len(rows) == 3 and [refused for _, refused in rows] == [False, True, False]
    task = (await store.list_tasks(kind=EMBED))[0]
    assert task.state == "pending"  # asleep until the next look, never given up


async def test_a_repeated_batch_changes_nothing(store, provider):
    """A process killed after storing a batch's vectors, before committing its cursor,
    embeds the batch again: the rows already there stay, none is added twice."""
    fake, embedder = provider
    await said(store, "cli:a", [("Anna", f"message {i}") for i in range(3)])
    ids = await searchable_ids(store)
    async with store.engines.write.begin() as conn:
        await _vectors.put(conn, store.dialect, embedder.model,
                           [(ids[0], 1, _vectors.pack([1.0, 0.0]))])
        await _vectors.put(conn, store.dialect, embedder.model,
                           [(ids[0], 1, _vectors.pack([0.0, 1.0]))])
    await embed_until_idle(store, embedder)
    assert len(await vector_rows(store)) == 3
    assert fake.texts == ["Anna: message 1", "Anna: message 2"]


async def test_a_changed_model_stops_the_old_task(store, provider):
    fake, embedder = provider
    await said(store, "cli:a", [("Anna", "hello there")])
    await ensure_embedding(store, embedder)
    other = OpenAIEmbedder(embedder.http, base_url=fake.base_url, model="another-model")
    runner = Runner(store, Registry(EmbedEntries(store, other)), OPTIONS)
    await runner.run(until_idle=True, horizon=0.5)
    old = (await store.list_tasks(kind=EMBED))[0]
    assert old.state == "done" and fake.requests == 0


async def test_hybrid_search_stays_in_scope(store, provider):
    """A person's private memory never reaches anyone else, through the vectors either:
    the DM's entry is the nearest to the question, and still not found from elsewhere."""
    fake, embedder = provider
    await said(store, "slack:T:D-zoe", [("zoe", "my locker code is quokka wombat")],
               owner="zoe", scope="private:zoe")
    await said(store, "slack:T:C1:1.0", [("ana", "the release train leaves on monday"),
                                         ("ana", "lunch at noon")], owner="ana",
               scope="channel:C1")
    await embed_until_idle(store, embedder)
    question = "what is the locker code quokka wombat?"
    seen = await remember(store, question, scopes=["channel:C1"], embedder=embedder)
    assert seen and all(h.conversation_key == "slack:T:C1:1.0" for h in seen)
    assert "quokka" not in " ".join(h.entry.text for h in seen)
    mine = await remember(store, question, scopes=["private:zoe"], embedder=embedder)
    assert [h.entry.text for h in mine] == ["my locker code is quokka wombat"]
    # the vector ranking alone (a lexical weight of 0) keeps to the scope too
    from store.hybrid import Fusion
    embedder.fusion = Fusion(0.0, 50)
    alone = await remember(store, question, scopes=["channel:C1"], embedder=embedder)
    assert {h.entry.text for h in alone} <= {"the release train leaves on monday",
                                             "lunch at noon"}
    assert fake.texts[-1] == question  # the question was embedded over HTTP


async def test_hybrid_falls_back_to_words_when_the_provider_is_down(store, provider):
    fake, embedder = provider
    await said(store, "cli:a", [("Anna", "the climbing gym was great")])
    await embed_until_idle(store, embedder)
    fake.fail_next(503)
    hits = await remember(store, "climbing gym", embedder=embedder)
    assert [h.entry.text for h in hits] == ["the climbing gym was great"]
