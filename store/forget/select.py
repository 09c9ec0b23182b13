"""Finding everything a target takes (store/forget), in the deleting transaction or for
the dry run. On PostgreSQL, in the transaction, the rows that others could add rows under
are locked first: the conversations (no entry, task or fork is added to one meanwhile),
then the tasks level by level (no child is added to one)."""

import json
import re

from store.documents import scrub
from store.forget import redact
from store.forget.model import (
    FORGOTTEN,
    Plan,
    Sql,
    Target,
    Touched,
    at_path,
    decoded,
    escaped,
    lock_rows,
    removed_entries,
    rows_of,
    searchable,
)
from store.records import TERMINAL

BLOB = re.compile(r'"blob":"([0-9a-f]{64})"')  # an attachment's content address
BLOB_LIKE = '%"blob":%'  # (no LIKE wildcard in it to escape)


async def _conversations(conn, dialect: str, t: Target, lock: bool) -> dict[int, str]:
    q = Sql(dialect)
    conds = [q.isin('"key"', t.keys, "text") if t.keys else "",
             q.isin("owner", t.owners, "text") if t.owners else "",
             q.isin("scope", t.scopes, "text") if t.scopes else ""]
    conds = [c for c in conds if c]
    if not conds:
        return {}
    found = {r.id: r.key for r in await rows_of(
        conn, f'SELECT id, "key" FROM conversations WHERE {" OR ".join(conds)}', q.params)}
    while found:  # and every fork below them, which reads their entries
        if lock:
            await lock_rows(conn, dialect, "conversations", found)
        q = Sql(dialect)
        new = {r.id: r.key for r in await rows_of(
            conn, f'SELECT id, "key" FROM conversations WHERE {q.isin("parent_id", found)}',
            q.params) if r.id not in found}
        if not new:
            break
        found.update(new)
    return found


async def _with_children(conn, dialect: str, roots: set[str], lock: bool) -> set[str]:
    """`roots` and every task below them, level by level (each level locked first)."""
    found, level = set(roots), sorted(roots)
    while level:
        if lock:
            await lock_rows(conn, dialect, "tasks", level, "text")
        q = Sql(dialect)
        rows = await rows_of(conn, f"SELECT id FROM tasks WHERE "
                                 f"{q.isin('parent_id', level, 'text')}", q.params)
        level = sorted({r.id for r in rows} - found)
        found.update(level)
    return found


async def _asked(conn, dialect: str, t: Target, gone: dict[int, str],
                 schedules: list[str]) -> set[str]:
    """The tasks (turns) whose inputs name the person (`askers`) or one of the schedules
    that go (`scheduled`), outside the conversations that go."""
    wanted = [(kind, key, {value}, f'"{key}":{json.dumps(value, ensure_ascii=False)}')
              for kind, key, value in t.askers]
    if t.scheduled and schedules:
        kind, key = t.scheduled
        wanted.append((kind, key, set(schedules), f'"{key}":'))
    found: set[str] = set()
    for kind, key, values, said in wanted:
        q = Sql(dialect)
        rows = await rows_of(conn, (
            f"SELECT id, inputs, conversation_id FROM tasks WHERE kind = {q.value(kind)} AND "
            f"{q.like('inputs', '%' + escaped(said) + '%')}"), q.params)
        found |= {r.id for r in rows if r.conversation_id not in gone
                  and at_path(decoded(r.inputs), (key,)) in values}
    return found


async def _schedules(conn, dialect: str, t: Target, gone: dict[int, str]) -> list[str]:
    q = Sql(dialect)
    owned = f" OR {q.isin('owner', t.schedule_owners, 'text')}" if t.schedule_owners else ""
    return sorted(r.id for r in await rows_of(conn, (
        f"SELECT id FROM schedules WHERE {q.isin('conversation_id', gone)}{owned}"), q.params))


_ENTRY = "id, conversation_id, seq, kind, data, task_id"


async def _entries_of(conn, dialect: str, t: Target, p: Plan) -> dict[int, object]:
    """Their entries in conversations that stay: id -> row."""
    found: dict[int, object] = {}
    kept = lambda q: f"NOT {q.isin('conversation_id', p.conversations)}"  # noqa: E731
    if p.tasks:
        q = Sql(dialect)
        for r in await rows_of(conn, f"SELECT {_ENTRY} FROM entries WHERE "
                                   f"{q.isin('task_id', p.tasks, 'text')} AND {kept(q)}",
                             q.params):
            found[r.id] = r
    if t.authors:
        q = Sql(dialect)
        for r in await rows_of(conn, f"SELECT {_ENTRY} FROM entries WHERE "
                                   f"{q.isin('author', t.authors, 'text')} AND {kept(q)}",
                             q.params):
            found[r.id] = r
    for m in t.marks:
        q = Sql(dialect)
        said = f'"{m.path[-1]}":{json.dumps(m.value, ensure_ascii=False)}'
        in_place = q.like('c."key"', escaped(m.key_prefix) + "%")
        rows = await rows_of(conn, (
            f"SELECT e.id, e.conversation_id, e.seq, e.kind, e.data, e.task_id FROM entries "
            f"AS e JOIN conversations AS c ON c.id = e.conversation_id WHERE {in_place} AND "
            f"{q.like('e.data', '%' + escaped(said) + '%')} AND "
            f"NOT {q.isin('e.conversation_id', p.conversations)}"), q.params)
        found.update((r.id, r) for r in rows if at_path(decoded(r.data), m.path) == m.value)
    for message_key, note_key in t.notes:
        said: dict[int, list[dict]] = {}
        for r in found.values():
            message = at_path(decoded(r.data), (message_key,))
            if isinstance(message, dict):
                said.setdefault(r.conversation_id, []).append(message)
        if not said:
            continue
        q = Sql(dialect)
        rows = await rows_of(conn, (
            f"SELECT {_ENTRY} FROM entries WHERE {q.isin('conversation_id', said)} AND "
            f"{q.like('data', '%' + escaped(json.dumps(note_key)) + ':%')}"), q.params)
        for r in rows:
            note = at_path(decoded(r.data), (note_key,))
            if isinstance(note, dict) and note and any(
                    all(m.get(k) == v for k, v in note.items())
                    for m in said[r.conversation_id]):
                found[r.id] = r
    return found


async def _summaries(conn, dialect: str, p: Plan, found: dict[int, object]) -> set[str]:
    """The conversations that stay and lose entries (`p.touched`), and the forks that saw
    them; each loses its summaries written after the first removed entry it sees, and
    its head marker moves back if that was one. Returns the tasks that wrote those
    summaries, when nothing still running waits for them."""
    seqs: dict[int, set[int]] = {}
    for r in found.values():
        seqs.setdefault(r.conversation_id, set()).add(r.seq)
    forks: list = []  # (fork, parent, fork point), parents before their forks
    level = sorted(seqs)
    while level:
        q = Sql(dialect)
        rows = await rows_of(conn, f"SELECT id, parent_id, fork_at FROM conversations WHERE "
                                 f"{q.isin('parent_id', level)} AND NOT "
                                 f"{q.isin('id', p.conversations)}", q.params)
        forks += rows
        level = [r.id for r in rows]

    def seen_by_forks() -> None:  # a fork sees its parent's positions up to its fork point
        for f in forks:
            seen = {s for s in seqs.get(f.parent_id, ()) if f.fork_at is None or s <= f.fork_at}
            if seen:
                seqs.setdefault(f.id, set()).update(seen)

    seen_by_forks()
    if not seqs:
        return set()
    summary_tasks: set[str] = set()
    summaries: dict[int, list] = {}
    for cid in list(seqs):
        q = Sql(dialect)
        summaries[cid] = await rows_of(conn, (
            f"SELECT {_ENTRY} FROM entries WHERE conversation_id = {q.value(cid)} AND "
            f"kind = 'compaction' ORDER BY seq"), q.params)
        first = min(seqs[cid])
        for r in summaries[cid]:
            if r.seq > first:
                found[r.id] = r
                seqs[cid].add(r.seq)
                if r.task_id:
                    summary_tasks.add(r.task_id)
    seen_by_forks()  # the parents' summaries that went, too
    q = Sql(dialect)
    convs = {r.id: r for r in await rows_of(
        conn, f'SELECT id, "key", head_seq FROM conversations WHERE {q.isin("id", seqs)}',
        q.params)}
    for cid, removed in seqs.items():
        conv = convs[cid]
        touch = Touched(conv.key, removed)
        if conv.head_seq is not None and conv.head_seq in removed:
            left = [r.seq for r in summaries[cid] if r.seq not in removed]
            touch.moves_head, touch.new_head = True, max(left, default=None)
        p.touched[cid] = touch
    if not summary_tasks:
        return set()
    # A summary's task (and the call that wrote it) goes only when what started it is
    # over: a turn still running may read its result.
    q = Sql(dialect)
    rows = await rows_of(conn, (
        f"SELECT t.id, t.state, p.state AS parent_state FROM tasks AS t LEFT JOIN tasks AS p "
        f"ON p.id = t.parent_id WHERE {q.isin('t.id', summary_tasks, 'text')}"), q.params)
    return {r.id for r in rows if r.state in TERMINAL
            and (r.parent_state is None or r.parent_state in TERMINAL)}


async def _blobs(conn, dialect: str, p: Plan) -> None:
    """The blobs the removed entries refer to, split into those nothing else refers to
    (they go) and those an entry that stays refers to as well (kept)."""
    q = Sql(dialect)
    removed = removed_entries(q, p)
    theirs: set[str] = set()
    for r in await rows_of(conn, f"SELECT data FROM entries WHERE {removed} AND "
                               f"{q.like('data', BLOB_LIKE)}",
                         q.params):
        theirs.update(BLOB.findall(r.data or ""))
    if not theirs:
        return
    q = Sql(dialect)
    removed = removed_entries(q, p)
    kept: set[str] = set()
    for r in await rows_of(conn, f"SELECT data FROM entries WHERE NOT {removed} AND "
                               f"{q.like('data', BLOB_LIKE)}",
                         q.params):
        kept.update(BLOB.findall(r.data or ""))
    p.blobs = sorted(theirs - kept)
    p.shared_blobs = len(theirs & kept)


async def select(conn, dialect: str, t: Target, *, lock: bool) -> Plan:
    """Everything `t` takes, as it is now (`lock`: in the deleting transaction)."""
    p = Plan()
    p.conversations = await _conversations(conn, dialect, t, lock)
    q = Sql(dialect)
    roots = {r.id for r in await rows_of(
        conn, f"SELECT id FROM tasks WHERE {q.isin('conversation_id', p.conversations)}",
        q.params)}
    p.schedules = await _schedules(conn, dialect, t, p.conversations)
    roots |= await _asked(conn, dialect, t, p.conversations, p.schedules)
    p.tasks = await _with_children(conn, dialect, roots, lock)
    found = await _entries_of(conn, dialect, t, p)
    more = await _summaries(conn, dialect, p, found)
    if more - p.tasks:
        more = await _with_children(conn, dialect, more - p.tasks, lock)
        q = Sql(dialect)
        for r in await rows_of(conn, f"SELECT {_ENTRY} FROM entries WHERE "
                                   f"{q.isin('task_id', more, 'text')} AND NOT "
                                   f"{q.isin('conversation_id', p.conversations)}", q.params):
            if r.conversation_id in p.touched:  # an aborted partial of that summary
                found[r.id] = r
                p.touched[r.conversation_id].seqs.add(r.seq)
        p.tasks |= more
    p.single = {r.id: r.conversation_id for r in found.values()}
    p.summaries = sum(r.kind == "compaction" for r in found.values())
    await _counts(conn, dialect, t, p, lock)
    await _blobs(conn, dialect, p)
    return p


async def _scrubbed(conn, dialect: str, p: Plan, lock: bool) -> None:
    """The documents that stay but were edited by what goes, and the copies forks took of
    them (parents first); what each loses; and what else quotes the texts it loses."""
    q = Sql(dialect)
    edited = {r.document_id for r in await rows_of(conn, (
        f"SELECT DISTINCT document_id FROM document_versions WHERE "
        f"({q.isin('conversation_id', p.conversations)} OR "
        f"{q.isin('task_id', p.tasks, 'text')}) AND NOT "
        f"{q.isin('document_id', p.documents)}"), q.params)}
    order, level = sorted(edited), sorted(edited)
    while level:  # a fork's copy holds the items as they were at the fork
        q = Sql(dialect)
        rows = await rows_of(conn, (
            f"SELECT id, forked_from FROM documents WHERE {q.isin('forked_from', level)} AND "
            f"NOT {q.isin('id', p.documents)}"), q.params)
        level = sorted(r.id for r in rows if r.id not in order)
        p.copied_from.update((r.id, r.forked_from) for r in rows if r.id in level)
        order += level
    p.scrubbed = order
    if lock:
        await lock_rows(conn, dialect, "documents", order)
    lost: dict[int, scrub.Scrub] = {}
    for doc in order:  # a copy comes after its source: it inherits what that loses
        inherited = lost.get(p.copied_from.get(doc), scrub.Scrub())
        lost[doc] = await scrub.taken(conn, doc, set(p.conversations), p.tasks, inherited)
    p.quoted = redact.quoted_texts(t for s in lost.values() for t in s.texts)
    p.quoting_entries, p.quoting_tasks = await redact.quoting(conn, dialect, p)


async def _counts(conn, dialect: str, t: Target, p: Plan, lock: bool) -> None:
    find = "strpos" if dialect == "postgresql" else "instr"
    q = Sql(dialect)
    removed = removed_entries(q, p)
    row = (await rows_of(conn, (
        f"SELECT count(*) AS n, coalesce(sum(CASE WHEN {searchable(find)} THEN 1 ELSE 0 "
        f"END), 0) AS s FROM entries WHERE {removed}"), q.params))[0]
    p.entries, p.searchable = row.n, row.s
    q = Sql(dialect)
    p.vectors = (await rows_of(conn, (
        f"SELECT count(*) AS n FROM entry_vectors WHERE entry_id IN (SELECT id FROM entries "
        f"WHERE {removed_entries(q, p)})"), q.params))[0].n
    q = Sql(dialect)
    p.unfinished = (await rows_of(conn, (
        f"SELECT count(*) AS n FROM tasks WHERE {q.isin('id', p.tasks, 'text')} AND "
        f"state NOT IN ({', '.join(repr(s) for s in sorted(TERMINAL))})"), q.params))[0].n
    # documents
    namespaces = [*t.namespaces, *(f"conversation:{c}" for c in p.conversations)]
    q = Sql(dialect)
    p.documents = sorted(r.id for r in await rows_of(
        conn, f"SELECT id FROM documents WHERE {q.isin('namespace', namespaces, 'text')}",
        q.params))
    q = Sql(dialect)
    p.versions = (await rows_of(conn, (
        f"SELECT count(*) AS n FROM document_versions WHERE "
        f"{q.isin('document_id', p.documents)}"), q.params))[0].n
    await _scrubbed(conn, dialect, p, lock)
    # submissions: tombstones, budget keys, quarantined events that name them
    q = Sql(dialect)
    tomb = {r.id for r in await rows_of(conn, (
        f"SELECT id FROM submissions WHERE state != '{FORGOTTEN}' AND "
        f"({q.isin('conversation_id', p.conversations)} OR "
        f"{q.isin('task_id', p.tasks, 'text')})"), q.params)}
    for marks in t.payload_marks:
        q = Sql(dialect)
        conds = " AND ".join(q.like("payload", "%" + escaped(m) + "%") for m in marks)
        tomb |= {r.id for r in await rows_of(
            conn, f"SELECT id FROM submissions WHERE state = 'quarantined' AND {conds}",
            q.params)}
    deleted: set[int] = set()
    for channel, pattern in t.submission_keys:
        q = Sql(dialect)
        deleted |= {r.id for r in await rows_of(conn, (
            f"SELECT id FROM submissions WHERE channel = {q.value(channel)} AND "
            f"{q.like('external_id', pattern)}"), q.params)}
    p.tombstones, p.deleted_submissions = sorted(tomb - deleted), sorted(deleted)
    q = Sql(dialect)
    p.usage = (await rows_of(conn, (
        f"SELECT count(*) AS n FROM usage WHERE {q.isin('conversation_id', p.conversations)}"
        f" OR {q.isin('task_id', p.tasks, 'text')}"), q.params))[0].n
    for marks in t.payload_marks:
        q = Sql(dialect)
        conds = " AND ".join(q.like("body", "%" + escaped(m) + "%") for m in marks)
        p.inbound += [(r.channel, r.event_id) for r in await rows_of(
            conn, f"SELECT channel, event_id FROM inbound WHERE {conds}", q.params)
            if (r.channel, r.event_id) not in p.inbound]


