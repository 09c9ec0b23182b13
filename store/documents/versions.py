"""Stored document versions: a base snapshot every `BASE_EVERY` deltas, ops in between.

Version 0 is the document's initial value and is always kept (fork policy `initial`).
History `rewindable` keeps every version, so a read as of any transcript position works;
history `latest` keeps only version 0 and the newest snapshot.
"""

import logging
from typing import Any

from sqlalchemy import and_, delete, func, insert, select, update

from store.documents.ops import OpError, apply_ops
from store.errors import (
    DocumentConflict,
    DocumentCorrupt,
    DocumentError,
    NotFound,
    StoreError,
)
from store.records import dumps, loads, now
from store.schema import document_versions as dv
from store.schema import documents
from store.sql import insert_ignore
from store.writes import DocumentWrite

BASE_EVERY = 32

log = logging.getLogger(__name__)


async def find(conn, namespace: str, name: str, *, lock: bool = False):
    query = select(documents).where(documents.c.namespace == namespace,
                                    documents.c.name == name)
    if lock:
        query = query.with_for_update()
    return (await conn.execute(query)).first()


async def _value_at(conn, doc_id: int, version: int) -> Any:
    """Rebuild a version: the nearest base at or below it, then the ops after that base."""
    base_version = (await conn.execute(
        select(func.max(dv.c.version)).where(dv.c.document_id == doc_id,
                                             dv.c.version <= version, dv.c.base.is_not(None))
    )).scalar()
    if base_version is None:
        raise DocumentCorrupt(f"document {doc_id} has no base at or below version {version}")
    rows = (await conn.execute(
        select(dv.c.version, dv.c.base, dv.c.ops)
        .where(dv.c.document_id == doc_id, dv.c.version >= base_version, dv.c.version <= version)
        .order_by(dv.c.version)
    )).all()
    value: Any = None
    for v, base, ops in rows:
        if v == base_version:
            value = loads(base, table="document_versions", row_id=(doc_id, v), column="base")
            continue
        try:
            value = apply_ops(value, loads(ops, table="document_versions", row_id=(doc_id, v),
                                           column="ops") or [])
        except OpError as exc:
            raise DocumentCorrupt(f"document {doc_id} version {v}: {exc}") from None
    return value


async def read(conn, namespace: str, name: str, *, as_of_seq: int | None = None,
               version: int | None = None) -> tuple[int, Any, int | None, int | None]:
    """(version, value, conversation_id, at_seq) of the newest version, or of the newest one
    written at or before transcript position `as_of_seq` (history `latest` has only the
    newest, so it answers every as-of read with that). A fork's copy answers for positions
    before its fork point from the document it was copied from: that past is shared."""
    doc = await find(conn, namespace, name)
    if doc is None:
        raise NotFound(f"no document {name!r} in {namespace!r}")
    return await _read_doc(conn, doc, as_of_seq=as_of_seq, version=version)


async def _read_doc(conn, doc, *, as_of_seq: int | None, version: int | None):
    while (version is None and as_of_seq is not None and doc.forked_from is not None
           and as_of_seq < doc.fork_at):
        doc = (await conn.execute(select(documents).where(documents.c.id == doc.forked_from))
               ).one()
    cond = [dv.c.document_id == doc.id]
    if version is not None:
        cond.append(dv.c.version == version)
    elif as_of_seq is not None and doc.history == "rewindable":
        cond.append(func.coalesce(dv.c.at_seq, 0) <= as_of_seq)
    row = (await conn.execute(
        select(dv.c.version, dv.c.conversation_id, dv.c.at_seq)
        .where(and_(*cond)).order_by(dv.c.version.desc()).limit(1)
    )).first()
    if row is None:
        raise NotFound(f"document {doc.name!r} in {doc.namespace!r} has no version {version}")
    return row.version, await _value_at(conn, doc.id, row.version), row.conversation_id, row.at_seq


async def create(conn, dialect: str, namespace: str, name: str, *, initial: Any, history: str,
                 fork_policy: str, conversation_id: int | None, forked_from: int | None = None,
                 fork_at: int | None = None):
    """Create the document with its version 0 if it does not exist; return its row locked."""
    t = now()
    inserted = (await conn.execute(
        insert_ignore(dialect, documents, "namespace", "name")
        .values(namespace=namespace, name=name, history=history, fork_policy=fork_policy,
                version=0, forked_from=forked_from, fork_at=fork_at, created_at=t,
                updated_at=t)
        .returning(documents.c.id)
    )).first()
    if inserted is not None:
        await conn.execute(insert(dv).values(
            document_id=inserted.id, version=0, base=dumps(initial), ops=None,
            conversation_id=conversation_id, at_seq=None, created_at=t))
    return await find(conn, namespace, name, lock=True)


async def write(conn, dialect: str, w: DocumentWrite, *, at_seq: int | None,
                task_id: str | None) -> int:
    """Append one version made of `w.ops`; returns the new version number. The ops are
    applied to the current value first, so an op that does not apply is refused here
    rather than stored. An edit made against `w.base_version` is refused with
    `DocumentConflict` if the document has moved on since: the row is locked (PostgreSQL)
    or the writer alone (SQLite), so this compare-and-set cannot race."""
    doc = await create(conn, dialect, w.namespace, w.name, initial=w.initial,
                       history=w.history, fork_policy=w.fork_policy,
                       conversation_id=w.conversation_id)
    if w.base_version is not None and doc.version != w.base_version:
        raise DocumentConflict(w.namespace, w.name, w.base_version, doc.version)
    current = await _value_at(conn, doc.id, doc.version)
    try:
        new_value = apply_ops(current, w.ops)
    except OpError as exc:
        raise DocumentError(f"document {w.name!r} in {w.namespace!r}: {exc}") from None
    version = doc.version + 1
    last_base = (await conn.execute(
        select(func.max(dv.c.version)).where(dv.c.document_id == doc.id, dv.c.base.is_not(None))
    )).scalar()
    snapshot = doc.history == "latest" or version - last_base >= BASE_EVERY
    if doc.history == "latest":
        await conn.execute(delete(dv).where(dv.c.document_id == doc.id, dv.c.version > 0))
    await conn.execute(insert(dv).values(
        document_id=doc.id, version=version,
        base=dumps(new_value) if snapshot else None,
        ops=None if snapshot else dumps(w.ops),
        conversation_id=w.conversation_id, at_seq=at_seq, task_id=task_id, created_at=now()))
    await conn.execute(update(documents).where(documents.c.id == doc.id)
                       .values(version=version, updated_at=now()))
    return version


async def copy_for_fork(conn, dialect: str, parent_ns: str, child_ns: str, *, fork_at: int,
                        child_conversation_id: int) -> None:
    """Give a new fork its own copy of each of the parent's documents, chosen by the
    document's fork policy: `initial` (version 0), `current` (newest) or `as_of` (as of the
    fork point). A document whose history is corrupt is left out (and logged) rather than
    making the whole conversation impossible to fork."""
    rows = (await conn.execute(select(documents).where(documents.c.namespace == parent_ns))).all()
    for doc in rows:
        try:
            initial = await _value_at(conn, doc.id, 0)
            if doc.fork_policy == "initial":
                value = initial
            elif doc.fork_policy == "current":
                value = await _value_at(conn, doc.id, doc.version)
            else:
                _, value, _, _ = await _read_doc(conn, doc, as_of_seq=fork_at, version=None)
        except StoreError as exc:
            log.error("fork of %s leaves out document %r: %s", parent_ns, doc.name, exc)
            continue
        await create(conn, dialect, child_ns, doc.name, initial=initial, history=doc.history,
                     fork_policy=doc.fork_policy, conversation_id=child_conversation_id,
                     forked_from=doc.id, fork_at=fork_at)
        if value != initial:
            await write(conn, dialect, DocumentWrite(
                child_ns, doc.name, [{"op": "set", "path": [], "value": value}], initial,
                doc.history, doc.fork_policy, child_conversation_id), at_seq=fork_at, task_id=None)
