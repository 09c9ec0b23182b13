"""Embedding the history in the background, durably: the `embed_entries` task.

One task per embedding model (dedupe key `embed:<model>:<generation>`), spawned when the
app opens (`ensure_embedding`). Each phase embeds one batch of the oldest entries after
its cursor that have no vector for the model yet (store/vectors.py `missing`), stores the
vectors in their own transaction, then commits the cursor: a process killed in between
repeats the batch, and storing it again changes nothing. Imports are picked up the same
way, in batches after their rows land. When nothing is left the task sleeps `IDLE_SECONDS`
(longer than `steward resume` waits, so resume does not wait for it) and looks again,
from `REWIND` ids before its cursor (PostgreSQL may commit a smaller id after a larger
one). A provider that is down or rate-limited puts the task to sleep with backoff, never
to rest: no entry stays unembedded forever. Inputs the provider refuses are tried one by
one, and only the refused ones are recorded as such (a NULL vector), never asked again.
"""

import logging

from bot.memory.embeddings import Embedder, EmbeddingRejected, EmbeddingUnavailable
from bot.runtime import Checkpoint, Continue, Done, KindSpec, Phase, Sleep, TaskContext, TaskDef
from bot.runtime.killpoints import kill_point
from store import TERMINAL, Store, Writes
from store import vectors as _vectors

__all__ = ["EMBED", "EmbedEntries", "ensure_embedding"]

log = logging.getLogger(__name__)

EMBED = "embed_entries"
IDLE_SECONDS = 120.0
REWIND = 10_000
BACKOFF = (5.0, 600.0)  # first and longest sleep while the provider is down


class Sweep(Checkpoint):
    after: int  # the last entry looked at
    failures: int = 0  # the provider's outage so far, for the backoff


class EmbedEntries(TaskDef):
    kind = EMBED
    # It runs its phases itself (the first one like the rest); the table checks them.
    spec = KindSpec(EMBED, version=1, phases=(Phase("", None), Phase("sweep", Sweep)))

    def __init__(self, store: Store, embedder: Embedder | None, *,
                 backoff: tuple[float, float] = BACKOFF):
        self.store, self.embedder, self.backoff = store, embedder, backoff

    async def _embed(self, rows: list[tuple]) -> list[tuple[int, int, bytes | None]]:
        texts = [_vectors.embeddable_text(author, body) for _, _, author, body in rows]
        try:
            vectors = await self.embedder.embed(texts)
            return [(r[0], r[1], _vectors.pack(v)) for r, v in zip(rows, vectors, strict=True)]
        except EmbeddingRejected:
            if len(rows) == 1:
                log.warning("embeddings: entry %s refused by the provider; not asked again",
                            rows[0][0])
                return [(rows[0][0], rows[0][1], None)]
        out = []
        for row in rows:  # find the refused one(s)
            out += await self._embed([row])
        return out

    async def step(self, ctx: TaskContext):
        _, cp = self.spec.read(ctx.phase, ctx.checkpoint)
        after, failures = (cp.after, cp.failures) if cp is not None else (0, 0)
        if self.embedder is None or self.embedder.model != ctx.inputs.get("model"):
            return Done({"stopped": "embeddings are configured differently now",
                         "after": after})
        model = self.embedder.model
        async with self.store.engines.read.connect() as conn:
            rows = await _vectors.missing(conn, model, after=after,
                                          limit=self.embedder.batch_size)
        if not rows:
            return Sleep(IDLE_SECONDS, "sweep", {"after": max(0, after - REWIND)})
        try:
            found = await self._embed(rows)
        except EmbeddingUnavailable as exc:
            first, longest = self.backoff
            delay = min(longest, first * 2 ** min(failures, 10))
            if exc.retry_after:
                delay = max(delay, min(exc.retry_after, longest))
            log.warning("embeddings unavailable (%s); again in %.0f s", exc, delay)
            return Sleep(delay, "sweep", {"after": after, "failures": failures + 1})
        async with self.store.engines.write.begin() as conn:
            await _vectors.put(conn, self.store.dialect, model, found)
        kill_point("embed-stored", EMBED)  # the vectors are committed, the cursor is not
        return Continue("sweep", {"after": rows[-1][0]})


async def ensure_embedding(store: Store, embedder: Embedder | None) -> None:
    """An `embed_entries` task for the embedder's model, unless one is active already:
    the same dedupe key in every process that opens the store now (after the last
    finished one), so two of them start one task."""
    if embedder is None:
        return
    embedder.warm()  # a local model is read now, not at the first search
    ours = [t for t in await store.list_tasks(kind=EMBED, limit=1000, newest_first=True)
            if (t.inputs or {}).get("model") == embedder.model]
    if any(t.state not in TERMINAL for t in ours):
        return
    generation = ours[0].id if ours else "first"
    w = Writes()
    w.spawn(EMBED, {"model": embedder.model},
            dedupe_key=f"embed:{embedder.model}:{generation}"[:500])
    await store.commit(w)
