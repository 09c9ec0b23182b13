"""The agent's side of the channel port: `LocalPort`, the `bot.port.AgentPort` a connector
is handed, served by this process's store and runner. What each call means is said in
bot/port.py; here is how it is done (one commit each, and a wake of the runner when the
call added work)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from bot.agent import approval
from bot.agent.deliver import Deliver
from bot.agent.events import Events
from bot.agent.inbox import Accepted, add_history, submit_message, withdraw_message
from bot.attachments import Attachments, BlobStore, Kept
from bot.port import Position
from store import TERMINAL, NotFound, Writes, conversation_namespace

if TYPE_CHECKING:
    import httpx

    from bot.agent.deps import AgentDeps
    from store import Conversation, Entry


def _write(at: Position, w: Writes) -> None:
    """Move a connector's position in the commit `w` (a versioned document)."""
    w.edit_document(at.owner, at.name, [{"op": "set", "path": [], "value": at.value}],
                    history="latest", fork_policy="current")


class LocalPort:
    """`bot.port.AgentPort` over this process's store; `wake` tells its runner."""

    def __init__(self, deps: AgentDeps):
        self._deps = deps
        self._store = deps.store
        self._attachments: Attachments | None = None

    # -- what the agent gives a connector ----------------------------------------------

    @property
    def events(self) -> Events:
        return self._deps.events

    def reconciling(self) -> bool:
        """Whether this home was just restored from a backup (bot/app/restore.py): what came
        in since the snapshot may have been answered already, by the home before it."""
        import time

        return time.time() < self._deps.reconcile_until

    @property
    def http(self) -> httpx.AsyncClient:
        """The process's HTTP client (files a message links to)."""
        return self._deps.http

    def wake(self) -> None:
        """New work was committed outside the port (the runner looks at once)."""
        self._deps.wake()

    # -- taking messages in --------------------------------------------------------------

    async def keep(self, data: bytes, *, name: str, media_type: str) -> Kept:
        """A shared file read (an image made ready for the model, a document's text) and
        its bytes stored by content hash, durably, before this returns: put `Kept.ref`
        in the message's data under `REF` and `Kept.text` in its text. Bad input is a
        note in `Kept.text`, never an exception."""
        if self._attachments is None:
            config = self._deps.config
            self._attachments = Attachments(BlobStore.of_home(config.home), config.attachments)
        return await self._attachments.keep(data, name=name, media_type=media_type)

    async def submit(self, *, channel: str, external_ids: list[str], conversation_key: str,
                     text: str, author: str | None = None, owner: str | None = None,
                     scope: str | None = None, reply_to: dict[str, Any] | None = None,
                     data: dict[str, Any] | None = None, timezone: str | None = None,
                     files: Sequence[tuple[str, Any]] = (), at: Position | None = None,
                     answers: str | None = None) -> Accepted:
        """One message for the agent (see `bot.agent.inbox.submit_message`); `files` are
        (document name, value) pairs stored in the conversation with it, `at` the
        position past it. A message taken before only moves the position. `answers`: which
        of the ids names the message itself wherever it is read (default: the first)."""
        def extra(conversation: Conversation, w: Writes) -> None:
            for name, value in files:
                w.edit_document(conversation_namespace(conversation.id), name,
                                [{"op": "set", "path": [], "value": value}], history="latest",
                                fork_policy="current", conversation_id=conversation.id)
            if at is not None:
                _write(at, w)

        accepted = await submit_message(
            self._store, channel=channel, external_ids=external_ids,
            conversation_key=conversation_key, text=text, author=author, owner=owner,
            reply_to=reply_to, data=data, scope=scope, timezone=timezone, extra=extra,
            answers=answers)
        if accepted.duplicate and at is not None and accepted.approval is None:
            await self.advance(at)
        if not accepted.duplicate:
            self.wake()
        return accepted

    async def history(self, *, channel: str, conversation_key: str,
                      messages: list[dict[str, Any]], owner: str | None = None,
                      scope: str | None = None, settled_only: bool = False) -> int:
        return await add_history(self._store, channel=channel,
                                 conversation_key=conversation_key, messages=messages,
                                 owner=owner, scope=scope, settled_only=settled_only)

    async def withdraw(self, *, channel: str, ref: str, conversation_id: int,
                       said: list[Entry], note: str, withdrawn_note: str,
                       author: str | None = None, data: dict[str, Any] | None = None
                       ) -> list[Entry]:
        withdrawn = await withdraw_message(
            self._store, channel=channel, ref=ref, conversation_id=conversation_id, said=said,
            note=note, withdrawn_note=withdrawn_note, author=author, data=data)
        if withdrawn:
            self.wake()  # the turn queued behind a withdrawn one may start now
        return withdrawn

    async def refuse(self, *, channel: str, external_ids: list[str], conversation_key: str,
                     text: str, reply_to: dict[str, Any], owner: str | None = None,
                     scope: str | None = None, payload: dict[str, Any] | None = None) -> bool:
        """Record a message not taken from someone not allowed, with one answer per
        conversation (keyed by it: never twice). True if it was new."""
        conversation = await self._store.ensure_conversation(conversation_key, owner=owner,
                                                             scope=scope)
        w = Writes()
        w.submit(channel, *external_ids, conversation_id=conversation.id, payload=payload)
        w.deliver(Deliver.kind, {"channel": channel, "text": text, "reply_to": reply_to},
                  key=f"{channel}-refusal:{conversation_key}", conversation_id=conversation.id)
        if (await self._store.commit(w)).duplicate:
            return False
        self.wake()
        return True

    async def skip(self, channel: str, external_ids: list[str], payload: dict[str, Any], *,
                   at: Position | None = None) -> bool:
        """A message that is not answered, recorded with why; True if it was new."""
        w = Writes()
        w.submit(channel, *external_ids, payload=payload)
        return await self._commit_at(w, at)

    async def quarantine(self, channel: str, external_ids: list[str], reason: str,
                         payload: Any = None, *, at: Position | None = None) -> bool:
        """An input that cannot be taken in, kept with the reason under each of its ids (a
        retry or replay of it is never submitted later); True if it was new."""
        w = Writes()
        for external_id in external_ids:
            w.quarantine(channel, external_id, reason, payload)
        return await self._commit_at(w, at)

    async def advance(self, at: Position) -> None:
        w = Writes()
        _write(at, w)
        await self._store.commit(w)

    async def _commit_at(self, w: Writes, at: Position | None) -> bool:
        if at is not None:
            _write(at, w)
        if not (await self._store.commit(w)).duplicate:
            return True
        if at is not None:  # recorded before: the position still moves past it
            await self.advance(at)
        return False

    # -- what a connector reads to route ----------------------------------------------

    async def submission(self, channel: str, external_id: str) -> dict[str, Any] | None:
        """How an id was taken: {"state", "conversation_id", "task_id", "payload"}, or None."""
        return await self._store.submission_state(channel, external_id)

    async def conversation(self, key: str) -> Conversation | None:
        try:
            return await self._store.get_conversation(key)
        except NotFound:
            return None

    async def conversation_by_id(self, conversation_id: int) -> Conversation | None:
        try:
            return await self._store.get_conversation_by_id(conversation_id)
        except NotFound:
            return None

    async def answer_pending(self, turn_id: str) -> bool:
        """Whether the turn's answer is still to come."""
        return (await self._store.get_task(turn_id)).state not in TERMINAL

    async def said(self, conversation_id: int, turn_id: str, mine: Callable[[dict], bool],
                   *, tail: int = 200) -> list[Entry]:
        """A message's user entries: among the newest `tail`, those with a turn whose data
        `mine` recognises (the message and its edits, submitted as new messages); else the
        turn's own entry (an older message, answered long ago)."""
        page = await self._store.entries_page(conversation_id, limit=tail)
        found = [e for e in page if e.kind == "user" and e.task_id and mine(e.data or {})]
        if not found:
            first = await self._store.entry_of_task(conversation_id, turn_id)
            found = [first] if first is not None and first.kind == "user" else []
        return found

    async def position(self, owner: str, name: str) -> dict[str, Any] | None:
        try:
            doc = await self._store.read_document(owner, name)
        except NotFound:
            return None
        return doc.value or None

    # -- several workers on one store ---------------------------------------------------

    @property
    def shared(self) -> bool:
        """Whether other workers may share this store (PostgreSQL): then what a channel
        acknowledges must be in the store (`journal_put`) before the acknowledgement, and
        a loop that must run once waits to be `leader`."""
        return not self._store.single_node

    async def journal_put(self, channel: str, event_id: str, body: dict, lease: float,
                          taker: str | None = None) -> None:
        await self._store.journal_put(channel, event_id, body, lease, taker)

    async def journal_done(self, channel: str, event_ids: list[str]) -> None:
        await self._store.journal_done(channel, event_ids)

    async def journal_stale(self, channel: str, *, lease: float, taker: str | None = None,
                            mine: bool = False) -> list[dict]:
        """Acknowledged events no live worker is taking in (their taker died); with
        `mine`, also those `taker` held in its previous life (at its start)."""
        return await self._store.journal_stale(channel, lease=lease, taker=taker, mine=mine)

    def leader(self, name: str, *, poll_seconds: float = 2.0) -> Any:
        """Leadership of a job among the workers (see store/leader.py)."""
        return self._store.leader(name, poll_seconds=poll_seconds)

    # -- approvals answered on the channel (a button) ------------------------------------

    async def answer_approval(self, approval_id: str, approved: bool, *, by: str) -> str:
        """"approved", "denied", or why not ("not yours", "expired", "answered", ...)."""
        return await approval.answer(self._store, approval_id, approved, by=by)

    async def approval_answer(self, approval_id: str) -> tuple[bool, str] | None:
        """The stored answer (approved, by whom), whichever click or reply gave it."""
        return await approval.answered(self._store, approval_id)

    # -- catching up after being away (Slack's history) ----------------------------------

    async def conversations_active(self, prefix: str, *, since: float, limit: int = 200,
                                   parts: int | None = None) -> list[Conversation]:
        """The conversations whose key starts with `prefix` (and has `parts` parts between
        colons, if given) that have a transcript and were active (an entry added) at
        `since` (Unix time) or later: the `limit` most recently active, latest first.
        Every conversation is looked at once, a page at a time, and no more than `limit`
        are held."""
        import heapq

        if limit <= 0:
            return []
        best: list[tuple[float, int, Conversation]] = []
        before: int | None = None
        while True:
            page = await self._store.list_conversations(limit=500, before_id=before)
            for c in page:
                if not (c.key.startswith(prefix) and c.last_seq > 0 and c.updated_at >= since):
                    continue
                if parts is None or c.key.count(":") + 1 == parts:
                    item = (c.updated_at, c.id, c)
                    if len(best) < limit:
                        heapq.heappush(best, item)
                    elif item[:2] > best[0][:2]:
                        heapq.heapreplace(best, item)
            if len(page) < 500:
                break
            before = page[-1].id
        return [c for _, _, c in sorted(best, key=lambda item: item[:2], reverse=True)]
