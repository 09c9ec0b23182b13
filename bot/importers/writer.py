"""Committing imported items in batches.

Dedupe is per commit (one already-seen submission turns the whole commit into a no-op),
so each batch first asks which of its external ids are known (on the import's channel,
and under the live connector's own ids, so mail or Slack messages Steward already took in
are not stored twice), then commits only the new ones, each with its own submission, in
one `Writes`. If the commit still comes back a duplicate (another import of the same file
running at the same moment), the batch is re-checked and, failing that, committed one
message at a time. A message the database refuses is reported as a problem and the rest
of its batch is kept.

An exported entry (`Item.seq`) is also already there when the conversation of its key
holds the same entry (kind, time to the microsecond, text) at its position: an export
imported back into the home it came from adds nothing.

A dry run only asks which ids are known (so it counts what an import would add, except
repeats of one message far apart in the file) and writes nothing.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError

from bot.importers.model import Item, Problem
from store import NotFound, Store, Writes

CONVERSATION_CACHE = 4096
PLACES = 2000  # positions compared at most per conversation and batch (a batch is 500)


def _refused(exc: Exception) -> bool:
    """The database (or the driver, encoding parameters) refused a value: one message's
    problem. Anything else (the database is gone) ends the import."""
    if isinstance(exc, DataError | IntegrityError | UnicodeError):
        return True
    return isinstance(exc, StatementError) and not isinstance(exc, DBAPIError)


@dataclass
class BatchResult:
    added: int = 0
    duplicates: int = 0
    problems: list[Problem] = field(default_factory=list)


class BatchWriter:
    def __init__(self, store: Store, channel: str, *, dry_run: bool = False):
        self.store = store
        self.channel = channel
        self.dry_run = dry_run  # only count what would be added; write nothing
        # key -> (conversation id, owner); least recently used first
        self._conversations: OrderedDict[str, tuple[int, str | None]] = OrderedDict()

    async def _ensure(self, key: str, owner: str | None, scope: str | None):
        known = self._conversations.get(key)
        if known is not None:
            self._conversations.move_to_end(key)
            return known
        conv = await self.store.ensure_conversation(key, owner=owner, scope=scope)
        self._conversations[key] = known = (conv.id, conv.owner)
        if len(self._conversations) > CONVERSATION_CACHE:
            self._conversations.popitem(last=False)
        return known

    async def _conversation(self, item: Item) -> int:
        cid, owner = await self._ensure(item.key, item.owner, item.scope)
        if item.foreign_key is not None and owner not in (None, item.owner):
            cid, _ = await self._ensure(item.foreign_key, item.owner, item.scope)
        return cid

    async def _new(self, items: list[Item]) -> list[Item]:
        """The items not imported (or taken in live) before, nor earlier in this batch."""
        known = await self.store.known_submissions(self.channel, [i.external_id for i in items])
        live: dict[str, list[str]] = defaultdict(list)
        for item in items:
            for channel, external_id in item.live_ids:
                live[channel].append(external_id)
        live_known = {channel: await self.store.known_submissions(channel, ids)
                      for channel, ids in live.items()}
        fresh = []
        for item in items:
            if item.external_id in known or any(
                    x in live_known[c] for c, x in item.live_ids):
                continue
            known.add(item.external_id)
            fresh.append(item)
        return await self._not_in_place(fresh)

    async def _not_in_place(self, items: list[Item]) -> list[Item]:
        """`items` without the exported entries their conversation holds at their place."""
        placed: dict[str, list[Item]] = defaultdict(list)
        for item in items:
            if item.seq is not None:
                placed[item.key].append(item)
        there: set[int] = set()  # id() of the items found in place
        for key, group in placed.items():
            try:
                conv = await self.store.get_conversation(key)
            except NotFound:
                continue
            low = min(i.seq for i in group)
            if conv.last_seq < low:
                continue  # the common case, a new home: nothing at these places yet
            span = min(max(i.seq for i in group) - low + 1, PLACES)
            page = await self.store.entries_page(conv.id, after=low - 1, limit=span)
            at = {e.seq: e for e in page}
            for item in group:
                e = at.get(item.seq)
                if e is not None and (e.kind, e.text) == (item.kind, item.text) and \
                        item.created_at is not None and \
                        round(e.created_at * 1e6) == round(item.created_at * 1e6):
                    there.add(id(item))
        return [i for i in items if id(i) not in there] if there else items

    async def _writes(self, items: list[Item]) -> Writes:
        w = Writes()
        for item in items:
            cid = await self._conversation(item)
            w.submit(self.channel, item.external_id, conversation_id=cid)
            w.append(cid, item.kind, item.text, author=item.author, ref=item.ref,
                     data=item.data, created_at=item.created_at, task_id=item.task_id,
                     head=item.head)
        return w

    async def write(self, items: list[Item]) -> BatchResult:
        result = BatchResult()
        if not items:
            return result
        fresh = await self._new(items)
        result.duplicates = len(items) - len(fresh)
        if self.dry_run:
            result.added = len(fresh)
            return result
        for _attempt in range(2):
            if not fresh:
                return result
            try:
                outcome = await self.store.commit(await self._writes(fresh))
            except Exception as exc:
                if not _refused(exc):
                    raise
                break  # one bad message: find it below
            if not outcome.duplicate:
                result.added += len(fresh)
                return result
            # Raced with another import: look again, then try once more.
            again = await self._new(fresh)
            result.duplicates += len(fresh) - len(again)
            fresh = again
        for item in fresh:  # one at a time
            try:
                outcome = await self.store.commit(await self._writes([item]))
            except Exception as exc:
                if not _refused(exc):
                    raise
                reason = str(getattr(exc, "orig", None) or exc)
                result.problems.append(Problem(f"ref {item.ref or item.external_id}",
                                               f"the store refused it: {reason[:200]}"))
                continue
            if outcome.duplicate:
                result.duplicates += 1
            else:
                result.added += 1
        return result
