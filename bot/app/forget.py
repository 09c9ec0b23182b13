"""`steward forget (--session KEY | --person ID) [--dry-run] [--yes]`: a conversation or a
person taken out of Steward everywhere, and the space their words took reclaimed.

Who a person is, as the store is told it (`store.forget.Target`):

- their conversations: every one in their private scope (`private:<ID>`: their DMs, their
  mail threads, schedules' own conversations) and every one they own, wherever it is,
  also a thread they started in a shared channel, with what others said in it (the dry run
  lists those keys: look before you confirm); with the forks of all of these;
- their messages in shared conversations that stay: what they said (found by the turn that
  answered it, whose `asker` is their id; by their id as the entry's author, as mail has
  it; by their Slack member id in the entry's data, within their workspace), the answers
  to them (the turn's own entries, its tool results), Slack's notes of their edits and
  deletions, and every summary written there since (it may repeat them: the context
  is summarised again without them). What Steward said to others there stays, also
  where it names them;
- their facts (`facts:private:<ID>`), and in documents that stay (a channel's facts, a
  shared to-do list) the items their turns added or changed;
- their schedules, their budget notes and hourly places, quarantined events and journal
  events that carry their id, their attachment blobs (a blob another message also refers
  to stays).

`--session KEY` takes that conversation and its forks, with its tasks, documents,
schedules and vectors, and the facts and items it wrote elsewhere.

Live work: on SQLite the command takes the home's runner lock (`bot/runtime/lock.py`), as
`steward run`, `chat` and `ask` do, and refuses while one of them holds it: a live process
keeps conversations and their contexts in memory, and SQLite gives a removed
conversation's id to the next one. On PostgreSQL workers may run on: the removal is one
transaction that locks what it removes first, and a worker's turn of a forgotten
conversation finds it gone at its next commit and is dropped (never crashing the runner).

The record: a row in the store's `forgotten` table (kind, the SHA-256 of the id or key,
counts per kind), written in the removing transaction. Then the space: blobs deleted,
SQLite's full-text segments merged, the database vacuumed, its `-wal` cut to nothing, the
vector index files removed, the Slack journal compacted; PostgreSQL's tables vacuumed
(store/reclaim.py). A forget stopped half-way (a crash after the commit) is finished by the
next `steward forget`. What was in backups and snapshots stays there.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import sys
from pathlib import Path

from bot.app.errors import UsageError
from bot.app.opened import opened_store

# connectors.slack.connector.JOURNAL_FILE (that module takes a second to import; a test
# keeps the two the same).
SLACK_JOURNAL = "slack-inbox.jsonl"
_SLACK_PERSON = re.compile(r"slack:([A-Za-z0-9]+):([A-Za-z0-9]+)")  # routing.owner_of
CONFIRM = "yes"
NOTE = ("(messages of a person Steward was told to forget were removed from here, with the "
        "summaries written since)")
BACKUPS = ("Older backups still hold what was forgotten: every backup made before now "
           "(`steward backup`: the [backup] dir, by default <home>/backups; copies of the home, "
           "database dumps) and the snapshots Steward takes before an upgrade (<home>/snapshots). "
           "Delete them, or keep them knowing that.")


class Refused(ValueError):
    """The forget cannot run now (exit 1): another process is live on this home."""


def target_of(args):
    """The `Target` for `--session` or `--person` (bot knowledge turned into data)."""
    from bot.agent.budget import NOTES, RATE
    from bot.agent.inbox import ASKER, TURN
    from bot.memory.facts import namespace
    from bot.memory.transcript import WITHDRAWS
    from store.forget import DataMark, Target, literal

    if args.session is not None:
        return Target("session", args.session, keys=(args.session,),
                      withdraw_key=WITHDRAWS, note=NOTE)
    person = args.person.strip()
    if not person:
        raise UsageError("--person needs the person's id (as `steward usage` shows it)")
    scope = f"private:{person}"
    marks, payload = [], [(json.dumps(person, ensure_ascii=False),)]
    slack = _SLACK_PERSON.fullmatch(person)
    if slack:  # their member id, within their workspace
        team, user = slack.groups()
        marks.append(DataMark(f"slack:{team}:", ("slack", "user"), user))
        payload.append((f'"{user}"', f'"{team}"'))
    # bot.agent.budget: a note per cap and period ("<cap>:<period>:<owner>"), a place per
    # model call in an hour ("<sha256 of the owner, 24 hex>:<hour>:<n>")
    places = hashlib.sha256(person.encode()).hexdigest()[:24]
    return Target(
        "person", person, owners=(person,), scopes=(scope,), namespaces=(namespace(scope),),
        askers=((TURN, ASKER, person),), authors=(person,), marks=tuple(marks),
        notes=(("slack", "slack_note"),), schedule_owners=(person,),
        scheduled=(TURN, "schedule"),  # a schedule's turn names it (bot/scheduler/loop.py)
        submission_keys=((NOTES, "%:" + literal(person)), (RATE, literal(places) + ":%")),
        payload_marks=tuple(payload), withdraw_key=WITHDRAWS, note=NOTE)


def _listing(plan, what: str) -> list[str]:
    c = plan.counts()
    lines = [f"{what}:"]
    lines.append(f"  conversations: {c['conversations']} (with their forks)")
    lines += [f"    {key}" for key in sorted(plan.conversations.values())]
    if plan.touched:
        lines.append(f"  their entries in conversations that stay: {c['entries_elsewhere']}, "
                     f"and {c['summaries']} summaries written since, in "
                     f"{len(plan.touched)} conversation(s):")
        lines += [f"    {t.key}" for t in sorted(plan.touched.values(), key=lambda t: t.key)]
    lines += [
        f"  entries: {c['entries']} (search index rows: {c['search_rows']}, "
        f"vectors: {c['vectors']})",
        f"  tasks: {c['tasks']} ({c['unfinished_tasks']} not finished: never run or "
        "continued)",
        f"  documents: {c['documents']} ({c['document_versions']} versions); documents that "
        f"stay, rewritten without them: {c['documents_scrubbed']} (their items' texts cut "
        f"from {c['entries_quoting']} entries and {c['tasks_quoting']} tasks that quote them)",
        f"  schedules: {c['schedules']}",
        f"  submissions: {c['submissions']} (of messages: kept as ids only, so that they "
        "are never taken in again)",
        f"  inbound events: {c['inbound_events']}",
        f"  usage rows detached from them (spend totals stay): {c['usage_rows_detached']}",
        f"  attachment blobs: {c['blobs']} ({c['blobs_shared_kept']} also in what stays: kept)"]
    return lines


def _name(args) -> str:
    return f"session {args.session}" if args.session is not None else f"person {args.person}"


def _take_lock(config):
    """On SQLite, the home's runner lock, or `Refused`."""
    from bot.runtime.lock import RunnerLock

    if not config.store_url.startswith("sqlite"):
        return None
    lock = RunnerLock(config.home / "runner.lock")
    if not lock.try_acquire():
        raise Refused(
            f"cannot forget while Steward runs on this home ({config.home}: `steward run`, "
            "or a chat or ask, holds runner.lock): it keeps conversations in memory. Stop "
            "it (`systemctl --user stop steward` for the service), run forget, start it "
            "again")
    return lock


async def _confirm() -> bool:
    try:
        answer = await asyncio.to_thread(input, f"Forget all of this for good? Type "
                                                f"{CONFIRM} to go on: ")
    except EOFError:  # Ctrl-D: no
        print()
        return False
    return answer.strip().lower() == CONFIRM


async def forget_command(config, args) -> int:
    from store import forget as store_forget

    if args.session is not None and not args.session.strip():
        raise UsageError("--session needs a conversation key (`steward sessions` lists them)")
    if not (args.dry_run or args.yes) and not sys.stdin.isatty():
        raise UsageError("refusing to forget without a confirmation: there is no terminal "
                         "to ask on. Add --yes to go on (see what goes with --dry-run)")
    target = target_of(args)
    lock = None if args.dry_run else await asyncio.to_thread(_take_lock, config)
    try:
        async with opened_store(config) as store:
            plan = await store_forget.plan(store, target)
            if args.session is not None and not plan.conversations:
                from store import NotFound

                raise NotFound(f"no conversation {args.session!r}")
            if plan.empty:
                print(f"Nothing stored for {_name(args)} (already forgotten? a person is "
                      "named by the id their conversations carry: `steward usage` lists "
                      "them)")
                if not args.dry_run:
                    await _finish(store, config)  # what an earlier forget left, if anything
                return 0
            lines = _listing(plan, f"{'Would forget' if args.dry_run else 'Forgetting'} "
                                   f"{_name(args)}")
            print("\n".join(lines), flush=True)
            if args.dry_run:
                print("Dry run: nothing was changed.")
                return 0
            if not args.yes and not await _confirm():
                print("Nothing was changed.")
                return 1
            done, record = await store_forget.forget(store, target)
            print(f"Forgotten: {_summary(done)}; recorded as forget #{record} (counts "
                  "only, no content)", flush=True)
            await _finish(store, config, target.payload_marks)
    finally:
        if lock is not None:
            lock.release()
    print(BACKUPS)
    return 0


def _summary(plan) -> str:
    c = plan.counts()
    return (f"{c['conversations']} conversation(s), {c['entries']} entries, "
            f"{c['tasks']} tasks, {c['documents']} documents, {c['schedules']} schedules, "
            f"{c['blobs']} blobs")


async def _finish(store, config, marks=()) -> None:
    """Blobs deleted and space reclaimed, for this forget and any an earlier process left
    half-done; `marks`: the person's events in the Slack journal go too."""
    from store import forget as store_forget
    from store.reclaim import reclaim

    records = await store_forget.pending(store)
    if not records:
        return
    removed = await _remove_blobs(store, config.home, records)
    done = await reclaim(store)
    journal = await _compact_slack_journal(config, marks) if done.backend == "sqlite" \
        else False
    if done.backend == "sqlite" and done.before is not None:
        print(f"Space reclaimed: the database and its -wal went from {_mb(done.before)} to "
              f"{_mb(done.after)}" + ("" if done.wal_truncated else
                                      " (its -wal could not be cut: a reader held it)")
              + f"; vector index files removed: {done.vector_files} (rebuilt from the "
              f"table when next searched); blobs deleted: {removed}"
              + ("; the Slack journal compacted" if journal else ""))
    elif done.backend == "postgresql":
        print(f"Space reclaimed: the tables vacuumed (their dead rows' space is reused from "
              f"now on; VACUUM FULL would also rewrite the files, locking the tables); blobs "
              f"deleted: {removed}")


def _mb(n: int | None) -> str:
    return f"{(n or 0) / 1e6:.1f} MB"


async def _remove_blobs(store, home: Path, records) -> int:
    from bot.attachments.blobs import BlobStore
    from store import forget as store_forget

    blobs = BlobStore.of_home(home)
    removed = 0
    for record in records:
        if not record.blobs:
            continue
        again = await store_forget.referenced(store, record.blobs)  # brought back since
        for digest in record.blobs:
            if digest not in again:
                removed += await asyncio.to_thread(_unlink, blobs.path(digest))
        await store_forget.blobs_removed(store, record.id)
    return removed


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1


async def _compact_slack_journal(config, marks) -> bool:
    """The Slack journal rewritten with only the events not yet taken in (done events go,
    with their text), less those that carry the forgotten person's id (`marks`, as for the
    shared journal's rows), while no process writes it (the runner lock is held)."""
    path = config.home / SLACK_JOURNAL
    if not await asyncio.to_thread(path.exists):
        return False
    from connectors.slack.journal import Journal

    journal = Journal(path)
    pending = await journal.open()  # rewritten: pending events only
    theirs = [body.get("event_id") or "" for body in pending
              if any(all(m in json.dumps(body, ensure_ascii=False) for m in group)
                     for group in marks)]
    for event_id in theirs:
        journal.done(event_id)
    await journal.close()
    if theirs:  # once more, so that the done ones go with their text
        await Journal(path).open()
    return True
