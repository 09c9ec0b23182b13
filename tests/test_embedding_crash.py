"""SIGKILL a real `steward` while it embeds an imported history, start it again, and count.

`steward import` lands a JSONL history (no embedding in that process); `steward resume`
opens the app, which spawns the `embed_entries` task (bot/memory/embedding_task.py) and runs
it until nothing is left. That resume is killed at each dangerous point of the task:

- `in-phase:embed_entries.` (the new task's first phase, ""): before anything is read;
- the provider's own kill (`provider-asked`): the fake provider SIGKILLs the asking process
  while its request is in flight, before answering (texts sent, no vector back);
- `embed-stored:embed_entries`: the batch's vectors are committed, the cursor is not (the
  next life starts from the old cursor, and must skip that batch, not ask for it again);
- `after-phase:embed_entries.sweep`: vectors and cursor committed;
- twice in a row (`embed-stored`, then the provider's kill in the next life).

Then a plain `steward resume`, and exactly: every searchable entry has one vector row, none
twice, none refused, each the vector of its own entry's text; the provider answered each
text exactly once (a stored batch is never asked again); one `embed_entries` task, healthy
and asleep until its next look (the task never ends while embeddings are configured: "done"
here is nothing missing, no error, its idle sleep). Both backends.
"""

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web
from sqlalchemy import text

from bot.memory.embedding_task import EMBED, IDLE_SECONDS
from store import open_store
from store import vectors as _vectors
from tests.fakes.embedding_server import FakeEmbeddings, hashed_embedding

ENTRIES = 120  # imported messages, all searchable
BATCH = 16  # embedding batch size: 8 batches
PROVIDER_KILL = "provider-asked"  # not a kill point: the fake provider kills the asker


class KillingEmbeddings(FakeEmbeddings):
    """The fake provider, which can SIGKILL the process asking it (by the pid this test
    started) on its `kill_on`-th request, before answering it."""

    def __init__(self):
        super().__init__()
        self.kill_on: int | None = None
        self.victim: int | None = None
        self.killed = 0

    async def _embeddings(self, request: web.Request) -> web.Response:
        if self.kill_on is not None and self.victim is not None:
            self.kill_on -= 1
            if self.kill_on == 0:
                self.kill_on = None
                os.kill(self.victim, signal.SIGKILL)
                self.killed += 1
                await asyncio.sleep(0.2)  # the asker is gone before any answer is written
                return web.json_response({"error": {"message": "killed"}}, status=503)
        return await super()._embeddings(request)


@pytest.fixture
async def provider():
    async with KillingEmbeddings() as fake:
        yield fake


def history() -> list[dict]:
    sessions = ["slack:T1:D-anna", "slack:T1:C-team:1.0", "cli:notes"]
    return [{"session": sessions[i % 3], "role": "user" if i % 2 == 0 else "assistant",
             "author": "Anna" if i % 2 == 0 else "Steward",
             "text": f"message {i} about the climbing gym, the puppy and ticket {1000 + i}",
             "ts": 1_700_000_000 + 60 * i, "ref": f"msg-{i}"} for i in range(ENTRIES)]


def make_home(tmp_path: Path, store_url: str, fake: FakeEmbeddings) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "scripted"
[embeddings]
provider = "openai"
base_url = "{fake.base_url}"
model = "{fake.model}"
batch_size = {BATCH}
[runtime]
concurrency = 2
lease_seconds = 2.0
retry_base_seconds = 0.05
retry_max_seconds = 0.1
""")
    with open(home / "history.jsonl", "w") as f:
        for line in history():
            f.write(json.dumps(line) + "\n")
    return home


async def steward(home: Path, *args: str, kill_at: str | None = None,
                  provider: KillingEmbeddings | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), STEWARD_CONFIG=str(home / "config.toml"))
    if kill_at and kill_at != PROVIDER_KILL:
        env["STEWARD_KILL_AT"] = kill_at
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=env, cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    if provider is not None:
        provider.victim = proc.pid
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if provider is not None:
            provider.victim, provider.kill_on = None, None
    return proc.returncode, out.decode(), err.decode()


async def killed_resume(home: Path, provider: KillingEmbeddings, point: str) -> None:
    if point == PROVIDER_KILL:
        provider.kill_on = 2  # the second batch's request, the first one stored
    code, _, err = await steward(home, "resume", kill_at=point, provider=provider)
    assert code == -signal.SIGKILL, f"{point}: exit {code}\n{err[-3000:]}"


async def embedded_state(store_url: str, model: str) -> dict:
    store = await open_store(store_url)
    try:
        async with store.engines.read.connect() as conn:
            one = lambda sql: conn.scalar(text(sql))  # noqa: E731
            entries = await conn.execute(text(
                "SELECT id, author, text FROM entries WHERE kind IN ('user', 'assistant', "
                "'tool_result', 'compaction') AND text != '' ORDER BY id"))
            entries = [tuple(r) for r in entries]
            vectors = {r[0]: r[1] for r in await conn.execute(text(
                "SELECT entry_id, vec FROM entry_vectors WHERE model = :m"), {"m": model})}
            state = {
                "entries": len(entries),
                "vector rows": await one("SELECT count(*) FROM entry_vectors"),
                "distinct entries": await one(
                    "SELECT count(DISTINCT entry_id) FROM entry_vectors"),
                "twice": await one("SELECT count(*) FROM (SELECT entry_id FROM entry_vectors "
                                   "GROUP BY entry_id HAVING count(*) > 1) AS d"),
                "without a vector": len(await _vectors.missing(conn, model, after=0,
                                                               limit=10 * ENTRIES)),
                "refused": await one("SELECT count(*) FROM entry_vectors WHERE vec IS NULL"),
                "orphans": await one("SELECT count(*) FROM entry_vectors AS v WHERE NOT "
                                     "EXISTS (SELECT 1 FROM entries AS e WHERE e.id = "
                                     "v.entry_id)"),
            }
            state["wrong vector"] = sum(
                1 for i, author, body in entries if i in vectors and vectors[i] is not None
                and vectors[i] != _vectors.pack(hashed_embedding(
                    _vectors.embeddable_text(author, body))))
            state["texts"] = [_vectors.embeddable_text(a, b) for _, a, b in entries]
        state["tasks"] = await store.list_tasks(limit=100)
    finally:
        await store.close()
    return state


async def where_it_died(store_url: str) -> tuple[int, bool]:
    """Vectors stored by the killed lives, and whether the task's cursor covers them all."""
    store = await open_store(store_url)
    try:
        async with store.engines.read.connect() as conn:
            count = await conn.scalar(text("SELECT count(*) FROM entry_vectors"))
            last = await conn.scalar(text("SELECT max(entry_id) FROM entry_vectors"))
        (task,) = await store.list_tasks(kind=EMBED)
    finally:
        await store.close()
    after = int((task.checkpoint or {}).get("after", 0))
    return count, last is None or after >= last


# case -> the kills in a row, and what they leave: vectors stored, the cursor past them
POINTS = {
    "in-phase": (["in-phase:embed_entries."], (0, True)),  # the new task's first phase
    "provider-asked": ([PROVIDER_KILL], (BATCH, True)),  # asked for the second batch
    "after-vectors-before-cursor": (["embed-stored:embed_entries"], (BATCH, False)),
    "after-cursor": (["after-phase:embed_entries.sweep"], (BATCH, True)),
    "twice": (["embed-stored:embed_entries", PROVIDER_KILL], (2 * BATCH, True)),
}


@pytest.mark.parametrize("case", list(POINTS))
async def test_embedding_survives_sigkill(store_url, tmp_path, provider, case):
    started = time.monotonic()
    home = make_home(tmp_path, store_url, provider)
    code, out, err = await steward(home, "import", str(home / "history.jsonl"))
    assert code == 0, err[-3000:]
    assert provider.requests == 0  # the import itself embeds nothing
    points, left = POINTS[case]
    for point in points:
        await killed_resume(home, provider, point)
    assert provider.killed == points.count(PROVIDER_KILL)
    assert await where_it_died(store_url) == left
    answered_before = len(provider.texts)
    assert answered_before < ENTRIES  # each kill left work for the next life
    code, out, err = await steward(home, "resume")
    assert code == 0, err[-3000:]

    state = await embedded_state(store_url, provider.model)
    assert state["entries"] == ENTRIES
    assert state["vector rows"] == state["distinct entries"] == ENTRIES, state
    assert (state["twice"], state["without a vector"], state["refused"], state["orphans"],
            state["wrong vector"]) == (0, 0, 0, 0, 0), {k: v for k, v in state.items()
                                                         if k not in ("texts", "tasks")}
    # The provider answered every text exactly once: no stored batch was asked again.
    assert Counter(provider.texts) == Counter(state["texts"])
    assert len(provider.texts) == ENTRIES
    tasks = state["tasks"]
    assert [t.kind for t in tasks] == [EMBED], [(t.kind, t.state) for t in tasks]
    task = tasks[0]
    assert (task.state, task.phase, task.error) == ("pending", "sweep", None), task
    assert task.run_after > time.time() + IDLE_SECONDS / 2  # asleep: nothing left to do
    # No life waited out a backoff or a stale lease (minutes); loaded CI needs ~32 s at most.
    assert time.monotonic() - started < 60
