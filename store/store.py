"""`Store`: the one entry point to durable state. Open it with `open_store(url)`."""

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, select

from store import commit as _commit
from store import inbound as _inbound
from store import leader as _leader
from store import schedules as _schedules
from store import tasks as _tasks
from store.backend import Backend, backend_for
from store.documents import versions as _versions
from store.engine import Engines, Upgrade, create_engines, described, migrate
from store.errors import NoSchema, NotFound
from store.parents import Parents
from store.read import queries as _reads
from store.records import (
    RUNNING,
    CommitResult,
    Conversation,
    DocumentVersion,
    Entry,
    Schedule,
    Task,
    conversation_from_row,
    dumps,
    now,
    schedule_from_row,
)
from store.revision import HEAD, current
from store.schema import conversations, storable, submissions, tasks, usage
from store.schema import schedules as schedules_table
from store.sql import insert_ignore
from store.writes import Claim, Writes

log = logging.getLogger(__name__)

_CONVERSATIONS_KNOWN = 10_000  # by id, for `known_conversation`
_KNOWN_PER_QUERY = 500  # well under SQLite's bound-parameter limit


def conversation_namespace(conversation_id: int) -> str:
    """The document namespace that belongs to a conversation (and forks with it)."""
    return f"conversation:{conversation_id}"


async def open_store(url: str, *, upgrade: bool = True, snapshot_dir: Path | None = None,
                     snapshot: bool = True, create: bool = True) -> "Store":
    """The store at `url`, migrated to this build's schema first (`upgrade`).

    An SQLite file that lost commits its home saw land is refused (`LostCommits`,
    store/wal_guard.py) before anything is written. A database behind is copied to
    `snapshot_dir` before it is migrated (store/snapshot.py; default: `snapshots/` beside
    an SQLite file, none for PostgreSQL, whose callers in Steward always name one), unless
    `snapshot` is False (the owner backed it up); `Store.upgrade` says what was done.
    Without `create`, a database Steward never opened is refused (`NoSchema`), untouched."""
    backend = backend_for(create_engines(url))
    try:
        await backend.opening()
        upgrade_done = None
        revision = await current(backend.engines)
        if revision is None and not create:
            raise NoSchema(f"no Steward tables in {described(url)} yet")
        if upgrade and revision != HEAD:  # at head: no Alembic loaded
            if snapshot_dir is None:
                snapshot_dir = backend.snapshot_dir()
            upgrade_done = await migrate(backend.engines,
                                         snapshot_dir=snapshot_dir if snapshot else None)
    except BaseException:
        await backend.close()
        raise
    store = Store(backend)
    store.upgrade = upgrade_done
    return store


class Store:
    """The facade: what the store does, on whichever database. Everything that differs
    between databases is behind `self._backend` (store/backend.py), never asked here."""

    def __init__(self, backend: "Backend | Engines"):
        if isinstance(backend, Engines):
            backend = backend_for(backend)
        self._backend = backend
        self.dialect = backend.dialect
        self.upgrade: Upgrade | None = None  # what `open_store` migrated, if anything
        self._writer = backend.engines.writer  # SQLite: every write transaction
        self._parents = Parents()
        # Each conversation as last read here (`known_conversation`).
        self._known: dict[int, Conversation] = {}

    @property
    def engines(self) -> Engines:
        """The engines underneath, for tests and tools that inspect the database itself
        (`engines.read`, `engines.write`, `await engines.pool()`)."""
        return self._backend.engines

    @property
    def single_node(self) -> bool:
        """One machine (SQLite); a file lock in the home dir then tells whether a runner is
        the only one (see bot.runtime)."""
        return self._backend.single_node

    async def close(self) -> None:
        await self._backend.close()

    # -- the one commit ----------------------------------------------------------------

    async def commit(self, writes: Writes, *, then_claim: Claim | None = None) -> CommitResult:
        """Everything in `writes` lands in one transaction, or nothing does. With
        `then_claim`, the tasks it leases are in `CommitResult.claimed`: taken in the same
        transaction or call where the backend can (one fsync for a result and the next
        task), else right after it; a step that is not applied claims nothing."""
        try:
            result = await self._backend.commit(writes, then_claim, self._parents)
        except _commit.DuplicateSubmission as dup:
            log.debug("duplicate submission %s: step not applied", dup)
            return CommitResult(duplicate=True)
        if writes.task_update is not None and writes.task_update.state != RUNNING:
            self._parents.forget(writes.task_update.task_id)  # its lease is given up
        if result.claimed:
            self._parents.remember(result.claimed)
        return result

    async def _write(self, fn):
        """`await fn(conn)` in one write transaction."""
        return await self._backend.write(fn)

    # -- conversations and entries -----------------------------------------------------

    async def ensure_conversation(self, key: str, *, owner: str | None = None,
                                  meta: dict | None = None,
                                  scope: str | None = None) -> Conversation:
        """The conversation with this key, created if new. `scope` says who may see what
        was said in it (default: private to its owner)."""
        try:  # the common case, every inbound message: one lookup, no write transaction
            return await self.get_conversation(key)
        except NotFound:
            pass
        t = now()

        async def ensure(conn):
            await conn.execute(insert_ignore(self.dialect, conversations, "key").values(
                key=key, owner=owner, last_seq=0, meta=dumps(meta or {}), created_at=t,
                updated_at=t, scope=scope or f"private:{owner or 'local'}"))
            return conversation_from_row((await conn.execute(
                select(conversations).where(conversations.c.key == key))).one())

        return await self._write(ensure)

    async def _read(self, fn):
        """`await fn(conn)` on a read connection (SQLAlchemy)."""
        return await self._backend.read(fn)

    async def _lookup(self, fn):
        """`await fn(conn)` with `conn` a `store.read.plain.TextConnection` straight on the
        driver, for the text SQL of store/read/queries.py."""
        return await self._backend.lookup(fn)

    async def _first(self, statement):
        """The first row `statement` reads, or None."""
        async def read(conn):
            return (await conn.execute(statement)).first()

        return await self._read(read)

    async def _all(self, statement) -> list:
        async def read(conn):
            return (await conn.execute(statement)).all()

        return await self._read(read)


    def reading(self):
        """A read connection, for the text SQL of store/read/queries.py, search.py, vectors.py."""
        return self._backend.engines.read.connect()

    async def get_conversation(self, key: str) -> Conversation:
        return await self._lookup(lambda conn: _reads.conversation(conn, key))

    async def get_conversation_by_id(self, conversation_id: int) -> Conversation:
        conversation = await self._lookup(
            lambda conn: _reads.conversation_by_id(conn, conversation_id))
        if len(self._known) >= _CONVERSATIONS_KNOWN:
            self._known.clear()
        self._known[conversation_id] = conversation
        return conversation

    async def known_conversation(self, conversation_id: int) -> Conversation:
        """The conversation as this store last read it, read only if it never was. Its
        key, owner, scope, meta and fork never change once it is made, so callers that need
        only those ask here (a turn asked five times); its positions (`last_seq`,
        `head_seq`) may be old: `get_conversation_by_id` reads them now."""
        known = self._known.get(conversation_id)
        return known if known is not None else await self.get_conversation_by_id(
            conversation_id)

    async def list_conversations(self, *, limit: int = 50,
                                 before_id: int | None = None) -> list[Conversation]:
        return await self._lookup(lambda conn: _reads.conversations_page(conn, limit,
                                                                          before_id))

    async def fork(self, key: str, new_key: str, *, at_seq: int | None = None) -> Conversation:
        """A new conversation that sees `key`'s entries up to `at_seq` (default: all of
        them now) without copying them, and gets the parent's documents by their policy."""
        t = now()

        async def fork(conn):
            parent = (await conn.execute(
                select(conversations).where(conversations.c.key == key))).first()
            if parent is None:
                raise NotFound(f"no conversation {key!r}")
            at = parent.last_seq if at_seq is None else at_seq
            if not 0 <= at <= parent.last_seq:
                raise ValueError(f"fork point {at} is outside {key!r} (1..{parent.last_seq})")
            child_id = (await conn.execute(insert(conversations).values(
                key=new_key, owner=parent.owner, parent_id=parent.id, fork_at=at, last_seq=at,
                meta=parent.meta, scope=parent.scope, created_at=t, updated_at=t,
                head_seq=parent.head_seq if parent.head_seq and parent.head_seq <= at else None
            ).returning(conversations.c.id))).scalar_one()
            await _versions.copy_for_fork(
                conn, self.dialect, conversation_namespace(parent.id),
                conversation_namespace(child_id), fork_at=at, child_conversation_id=child_id)
            return conversation_from_row((await conn.execute(
                select(conversations).where(conversations.c.id == child_id))).one())

        return await self._write(fork)

    async def entries_page(self, conversation_id: int, *, before: int | None = None,
                           after: int | None = None, limit: int = 50) -> list[Entry]:
        """One page of a transcript in order, by cursor: the `limit` entries just before
        position `before` (default: the newest), or just after position `after`. A fork's
        page includes its ancestors' entries up to the fork point."""
        return await self._lookup(lambda conn: _reads.entries_page(
            conn, conversation_id, before=before, after=after, limit=limit))

    async def entry_of_task(self, conversation_id: int, task_id: str) -> Entry | None:
        """The first entry a task wrote in a conversation (e.g. a turn's user message)."""
        return await self._lookup(lambda conn: _reads.entry_of_task(conn, conversation_id,
                                                                     task_id))

    # -- tasks -------------------------------------------------------------------------

    async def get_task(self, task_id: str) -> Task:
        return await self._lookup(lambda conn: _reads.task(conn, task_id))

    async def list_tasks(self, *, state: str | None = None, kind: str | None = None,
                         parent_id: str | None = None, conversation_id: int | None = None,
                         active: bool | None = None, limit: int = 100,
                         after_id: str | None = None, before_id: str | None = None,
                         newest_first: bool = False) -> list[Task]:
        """Tasks in id (creation) order, filtered; `active` = not in a terminal state."""
        return await self._lookup(lambda conn: _reads.tasks_page(
            conn, limit=limit, active=active, newest_first=newest_first, state=state,
            kind=kind, parent_id=parent_id, conversation_id=conversation_id,
            after_id=after_id, before_id=before_id))

    async def last_result(self, *, kind: str, conversation_id: int) -> Any:
        """The result of the newest finished task of a kind in a conversation (only that
        column is read: task inputs can be large)."""
        return await self._lookup(lambda conn: _reads.last_result(conn, kind,
                                                                   conversation_id))

    async def task_outcome(self, task_id: str) -> tuple[str, Any, str | None]:
        """(state, result, error) of a task, without reading its inputs."""
        return await self._lookup(lambda conn: _reads.task_outcome(conn, task_id))

    async def count_tasks(self) -> dict[str, int]:
        rows = await self._all(select(tasks.c.state, func.count()).group_by(tasks.c.state))
        return {state: n for state, n in rows}

    async def claim_tasks(self, owner: str, limit: int, lease_seconds: float) -> list[Task]:
        return await self.claim(Claim(owner, limit, lease_seconds))

    async def claim(self, c: Claim) -> list[Task]:
        """Lease ready tasks as `c` says (store.writes.Claim)."""
        claimed = await self._backend.claim(c)
        self._parents.remember(claimed)
        return claimed

    async def release_tasks(self, owner: str, task_ids: list[str], *,
                            run_after: float = 0.0, claim: Claim | None = None) -> int:
        """Hand claimed tasks back untouched (nothing counted against them), due at
        `run_after`; an intent that rode on `claim` is taken back with them."""
        for task_id in task_ids:
            self._parents.forget(task_id)
        ride = claim.ride if claim is not None and claim.intent_kinds else None
        return await self._write(lambda conn: _tasks.release(conn, owner, task_ids, run_after,
                                                             ride))

    async def renew_leases(self, owner: str, task_ids: list[str], lease_seconds: float) -> int:
        return await self._write(lambda conn: _tasks.renew(conn, owner, task_ids,
                                                            lease_seconds))

    # -- the shared inbound journal and leaders (several workers; store/inbound.py) -----

    async def journal_put(self, channel: str, event_id: str, body: dict, lease: float,
                          taker: str | None = None) -> None:
        await self._write(lambda conn: _inbound.put(conn, self.dialect, channel, event_id,
                                                    body, lease, taker))

    async def journal_done(self, channel: str, event_ids: list[str]) -> None:
        await self._write(lambda conn: _inbound.done(conn, channel, event_ids))

    async def journal_stale(self, channel: str, *, lease: float, limit: int = 100,
                            taker: str | None = None, mine: bool = False) -> list[dict]:
        return await self._write(lambda conn: _inbound.stale(conn, self.dialect, channel,
                                                             lease, limit, taker, mine))

    def leader(self, name: str, *, poll_seconds: float = 2.0) -> _leader.Leader:
        """Leadership of `name` among the workers on this store (store/leader.py)."""
        return self._backend.leader(name, poll_seconds)

    async def take_over_dead(self, owners: list[str] | None = None) -> int:
        """Running tasks of workers that died (their liveness lock is free: all such, or
        those of `owners` found so) go back to pending at once, a death counted for each
        (none where there is one node)."""
        dead = await self._backend.dead_owners()
        if owners is not None:
            dead = [o for o in dead if o in owners]
        if not dead:
            return 0
        return (await self._write(lambda conn: _tasks.recover(
            conn, steal_all=False, dead_owners=dead, registered_kinds=[])))["resumed"]

    async def dead_workers(self) -> list[str]:
        """Owners of running tasks whose liveness lock is free now (PostgreSQL)."""
        return await self._backend.dead_owners()

    async def announce_worker(self, owner: str) -> bool:
        """Make this worker's liveness visible to others (PostgreSQL), until `close`; once
        it is, check the lock is still held, and take it again if its connection died
        with the server (a restart drops every session lock). True when it had to be taken
        again: every other worker lost its own then too."""
        return await self._backend.announce_worker(owner)

    async def recover_tasks(self, *, steal_all: bool, registered_kinds: list[str]) -> dict:
        dead = [] if steal_all else await self._backend.dead_owners()
        return await self._write(lambda conn: _tasks.recover(
            conn, steal_all=steal_all, dead_owners=dead, registered_kinds=registered_kinds))

    async def next_due(self) -> float | None:
        return await self._read(_tasks.next_due)

    # -- schedules ---------------------------------------------------------------------

    async def list_schedules(self, *, state: str | None = None,
                             conversation_id: int | None = None,
                             limit: int = 100) -> list[Schedule]:
        return await self._lookup(lambda conn: _reads.schedules_page(
            conn, state=state, conversation_id=conversation_id, limit=limit))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        row = await self._first(select(schedules_table)
                                .where(schedules_table.c.id == schedule_id))
        if row is None:
            raise NotFound(f"no schedule {schedule_id}")
        return schedule_from_row(row)

    async def due_schedules(self, t: float, *, limit: int = 100) -> list[Schedule]:
        return await self._read(lambda conn: _schedules.due(conn, t, limit))

    async def next_schedule_time(self) -> float | None:
        return await self._read(_schedules.next_time)

    # -- documents, submissions, usage -------------------------------------------------

    async def read_document(self, namespace: str, name: str, *, as_of_seq: int | None = None,
                            version: int | None = None) -> DocumentVersion:
        v, value, conversation_id, at_seq = await self._read(lambda conn: _versions.read(
            conn, namespace, name, as_of_seq=as_of_seq, version=version))
        return DocumentVersion(namespace, name, v, value, conversation_id, at_seq)

    async def submission_state(self, channel: str, external_id: str) -> dict[str, Any] | None:
        row = await self._first(select(submissions).where(
            submissions.c.channel == channel, submissions.c.external_id == external_id))
        return None if row is None else dict(row._mapping)

    async def known_submissions(self, channel: str, external_ids: list[str]) -> set[str]:
        """Which of `external_ids` the channel has already taken in (a batch's dedupe)."""
        stored = {storable(x): x for x in external_ids}  # as the column keeps them
        ids = list(stored)

        async def read(conn) -> set[str]:
            found: set[str] = set()
            for i in range(0, len(ids), _KNOWN_PER_QUERY):
                part = ids[i:i + _KNOWN_PER_QUERY]
                rows = await conn.execute(*self._backend.known_statement(channel, part))
                found.update(stored[r[0]] for r in rows)
            return found

        return await self._read(read)

    async def list_submissions(self, *, state: str | None = None, channel: str | None = None,
                               limit: int = 100) -> list[dict[str, Any]]:
        """Inbound submissions, newest first (e.g. state "quarantined": what could not be
        processed, with the reason)."""
        return await self._lookup(lambda conn: _reads.submissions_page(
            conn, state=state, channel=channel, limit=limit))

    async def usage_totals(self) -> dict[str, Any]:
        row = await self._first(select(
            func.count(), func.coalesce(func.sum(usage.c.input_tokens), 0),
            func.coalesce(func.sum(usage.c.output_tokens), 0),
            func.coalesce(func.sum(usage.c.cost_usd), 0.0)))
        return {"calls": row[0], "input_tokens": row[1], "output_tokens": row[2],
                "cost_usd": row[3]}

    async def spend_since(self, since: float, *, owner: str | None = None) -> float:
        """What the ledger's calls since `since` cost, in all (None) or in the
        conversations of one `owner` (as conversations name theirs)."""
        query = select(func.coalesce(func.sum(usage.c.cost_usd), 0.0)).where(
            usage.c.created_at >= since)
        if owner is not None:
            query = query.where(usage.c.conversation_id.in_(
                select(conversations.c.id).where(conversations.c.owner == owner)))
        return float((await self._first(query))[0])

    async def spend_report(self, since: float, *, day_offset: float = 0.0) -> list[dict]:
        """The ledger since `since` by person (the conversation's owner), model and day:
        `{"owner", "model", "day" (days since the epoch, shifted by `day_offset` seconds
        to the owner's clock), "calls", "input_tokens", "output_tokens", "cost"}`."""
        return await self._lookup(lambda conn: _reads.spend_report(conn, since, day_offset,
                                                                   self.dialect))

    # -- search ------------------------------------------------------------------------

    async def shared_scopes_of(self, owner: str) -> list[str]:
        """The shared scopes (channels) in which `owner` has talked with Steward: what that
        person may also search from their private conversations."""
        rows = await self._all(select(conversations.c.scope).distinct().where(
            conversations.c.owner == owner, conversations.c.scope.like("channel:%")))
        return sorted(r[0] for r in rows)

    async def search(self, query: str, *, scopes: list[str] | None = None,
                     conversation_key: str | None = None, limit: int = 10, offset: int = 0,
                     context: int = 1, at: float | None = None,
                     when: tuple[float, float] | None = None) -> list:
        """Full-history search (`store/search.py`): a page of ranked `Hit`s with `context`
        neighbours each side, only from conversations whose scope is in `scopes` (None: no
        restriction) and, if given, from the one conversation `conversation_key`. Recency
        is measured from `at` (default: now, rounded up to the hour, so that consecutive
        pages are ranked against the same clock); `when` is the question's time, if it
        names one ([since, until) in unix seconds). With embeddings: `store.hybrid.find`."""
        from store import hybrid  # here: the one method that needs it

        return await hybrid.find(self, query, scopes=scopes, conversation_key=conversation_key,
                                 limit=limit, offset=offset, context=context, at=at, when=when)
