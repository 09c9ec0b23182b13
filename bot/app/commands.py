"""What each `steward` command does (the parser is `bot/app/cli.py`), and every error that
ends one as a single line.

Imports are made by the command that needs them: the commands that only read (`sessions`,
`log`, `search`, `tasks`, `schedules`, `quarantine`, `usage`) load the store's reads and
the config as last validated, not pydantic, the agent, the model clients, Slack
or Alembic (start-up time is what a person waits for at every command;
tests/test_cli_startup.py keeps it so)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from bot.app.config_snapshot import recall
from bot.app.errors import UsageError
from bot.app.opened import (
    MADE_BY,
    NOTHING_YET,
    NoDatabase,
    absent_database,
    no_database_line,
    opened_reader,
    opened_store,
)
from bot.app.problems import describe
from bot.config_source import locate
from bot.home import check_home

if TYPE_CHECKING:
    from bot.app.config import StewardConfig as Config

CELL = 60  # characters of a listing's cell shown; the rest is cut with "…"


def _ts(t: float) -> str:
    """ISO-8601 in UTC, as the JSONL import format and search results have it."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _cell(value) -> str:
    if value is None or value == "":
        return "-"
    text = " ".join(str(value).split())  # one line per row, whatever the value holds
    return text if len(text) <= CELL else text[:CELL - 1] + "…"


def _emit(rows: list[dict], as_json: bool, columns: list[str], empty: str) -> None:
    """A listing: one JSON object per line (nothing at all when empty), or a table with a
    header, its columns aligned, and the line `empty` when there are no rows."""
    if as_json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False, default=str))
        return
    if not rows:
        print(empty)
        return
    table = [[c.upper() for c in columns]] + [[_cell(row.get(c)) for c in columns]
                                              for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


async def _tasks(config: Config, args) -> int:
    from bot.app.lease_holder import holder_alive

    async with opened_reader(config) as store:
        found = await store.list_tasks(state=args.state, limit=args.limit)
    rows = [{"id": t.id, "kind": t.kind, "state": t.state, "phase": t.phase,
             "attempts": t.attempts, "parent": t.parent_id, "error": t.error,
             "failure": t.failure, "updated": _ts(t.updated_at),
             "stalled": t.stalled(alive=holder_alive)} for t in found]
    if not args.json:  # running, says the store; but no live process runs it any more
        rows = [{**r, "state": "waiting to resume"} if r["stalled"] else r for r in rows]
    _emit(rows, args.json, ["id", "kind", "state", "phase", "attempts", "failure", "error"],
          f"no {args.state} tasks" if args.state else "no tasks")
    return 0


async def _schedules(config: Config, args) -> int:
    async with opened_reader(config) as store:
        found = await store.list_schedules(state=None if args.all else "active",
                                           limit=args.limit)
        keys = {}
        for s in found:
            if s.conversation_id is not None and s.conversation_id not in keys:
                keys[s.conversation_id] = (await store.get_conversation_by_id(
                    s.conversation_id)).key
    rows = [{"id": s.id, "name": s.name, "state": s.state, "trigger": s.trigger,
             "timezone": s.timezone, "next": _ts(s.next_fire_at) if s.next_fire_at else None,
             "last": _ts(s.last_fire_at) if s.last_fire_at else None, "fired": s.fired,
             "session": keys.get(s.conversation_id), "deliver": s.deliver.get("channel"),
             "prompt": s.prompt, "from": s.origin or "you"} for s in found]
    _emit(rows, args.json, ["id", "state", "next", "name", "session", "from"],
          "no schedules" if args.all else
          "no active schedules (--all also lists finished and cancelled ones)")
    return 0


async def _quarantine(config: Config, args) -> int:
    async with opened_reader(config) as store:
        found = await store.list_submissions(state="quarantined", channel=args.channel,
                                             limit=args.limit)
    rows = [{"channel": q["channel"], "external_id": q["external_id"], "reason": q["reason"],
             "ts": _ts(q["created_at"])} for q in found]
    _emit(rows, args.json, ["ts", "channel", "external_id", "reason"],
          f"nothing quarantined from {args.channel}" if args.channel
          else "nothing quarantined")
    return 0


async def _usage(config: Config, args) -> int:
    """The ledger by person, model and day (days in `[agent] timezone`), in `[limits]
    currency`, newest day first."""
    from zoneinfo import ZoneInfo

    zone = ZoneInfo(config.agent.timezone)
    now = datetime.now(zone)
    offset = now.utcoffset().total_seconds()
    start = now.replace(hour=0, minute=0, second=0, microsecond=0).timestamp() \
        - 86400 * (args.days - 1)
    async with opened_reader(config) as store:
        found = await store.spend_report(start, day_offset=offset)
    limits = config.limits
    rows = [{"day": datetime.fromtimestamp(r["day"] * 86400, UTC).strftime("%Y-%m-%d"),
             "person": r["owner"] or "-", "model": r["model"], "calls": r["calls"],
             "input_tokens": r["input_tokens"], "output_tokens": r["output_tokens"],
             "cost": round(r["cost"] * limits.per_usd, 6), "currency": limits.currency}
            for r in reversed(found)][:args.limit]
    _emit(rows, args.json, ["day", "person", "model", "calls", "input_tokens",
                            "output_tokens", "cost"],
          f"no model calls in the last {args.days} days")
    if rows and not args.json:
        total = sum(r["cost"] for r in rows)
        print(f"total {total:.2f} {limits.currency}")
    return 0


async def _sessions(config: Config, args) -> int:
    async with opened_reader(config) as store:
        found = await store.list_conversations(limit=args.limit)
    rows = [{"key": c.key, "entries": c.last_seq, "owner": c.owner,
             "parent": c.parent_id, "fork_at": c.fork_at, "updated": _ts(c.updated_at)}
            for c in found]
    _emit(rows, args.json, ["key", "entries", "updated"], "no conversations yet")
    return 0


async def _log(config: Config, args) -> int:
    async with opened_reader(config, listing=False) as store:
        conv = await store.get_conversation(args.key)
        page = await store.entries_page(conv.id, before=args.before, limit=args.limit)
    rows = [{"session": args.key, "entry": e.seq, "kind": e.kind, "role": e.kind,
             "author": e.author,
             "text": e.text, "ts": _ts(e.created_at), "ref": e.ref, "data": e.data}
            for e in page]
    if args.json:
        _emit(rows, True, [], "")
        return 0
    if not rows:
        print(f"no entries before {args.before} in {args.key}" if args.before is not None
              else f"no entries in {args.key}")
    for r in rows:
        calls = "".join(f" -> {c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})"
                        for c in (r["data"] or {}).get("tool_calls", []))
        author = f" {r['author']}" if r["author"] else ""
        print(f"[{r['entry']}] {r['ts']} {r['kind']}{author}: {r['text']}{calls}")
    return 0


async def _fork(config: Config, args) -> int:
    from bot.app.fork import fork_command

    return await fork_command(config, args)


async def _facts(config: Config, args) -> int:
    """Every kept fact with where its words came from: "you", or the outside text it was
    written from (bot/provenance.py), which the model is shown as data."""
    from bot.memory.facts import read_facts
    from store.errors import NoSchema

    rows = []
    try:
        if absent_database(config) is None:
            async with opened_store(config, create=False) as store:
                scopes = [args.scope] if args.scope else sorted(
                    {c.scope for c in await store.list_conversations(limit=100_000)})
                rows = [{"scope": scope, "number": item.get("id"), "since": item.get("since"),
                         "from": item.get("outside") or "you", "text": item.get("text", "")}
                        for scope in scopes for item in await read_facts(store, scope)]
    except NoSchema as exc:  # PostgreSQL without Steward's tables: nothing kept yet
        print(f"steward: {exc}: {NOTHING_YET}", file=sys.stderr, flush=True)
    _emit(rows, args.json, ["scope", "number", "from", "text"], "no facts kept")
    return 0


async def _doc(config: Config, args) -> int:
    from store import NotFound, conversation_namespace

    async with opened_store(config, create=False) as store:
        conv = await store.get_conversation(args.key)
        namespace = conversation_namespace(conv.id)
        try:
            doc = await store.read_document(namespace, args.name)
        except NotFound:
            raise NotFound(f"{args.key} has no document {args.name!r}") from None
        if args.as_of is not None:
            try:
                doc = await store.read_document(namespace, args.name, as_of_seq=args.as_of)
            except NotFound:
                raise NotFound(f"document {args.name!r} of {args.key} did not exist yet at "
                               f"entry {args.as_of}") from None
    if args.json:
        print(json.dumps({"session": args.key, "name": args.name, "version": doc.version,
                          "at": doc.at_seq, "value": doc.value}, ensure_ascii=False))
    else:
        print(json.dumps(doc.value, indent=2, ensure_ascii=False))
    return 0


async def _db(config: Config, args) -> int:
    """`steward db upgrade [--no-snapshot]`: migrate now, after a snapshot (store/snapshot.py)."""
    async with opened_store(config, snapshot=not args.no_snapshot) as store:
        upgrade = store.upgrade
    if upgrade is None or not upgrade.migrated or upgrade.before is None:  # (None: new)
        print("database is up to date")
    elif upgrade.snapshot is not None:
        print(f"database migrated from {upgrade.before} to {upgrade.after}; a snapshot of it "
              f"as it was is in {upgrade.snapshot}")
    else:
        print(f"database migrated from {upgrade.before} to {upgrade.after} (no snapshot taken)")
    return 0


async def _with_app(config: Config, body) -> int:
    from bot.app import wiring as app

    async with app.open_app(config) as opened:
        if opened.banner:
            print(opened.banner, file=sys.stderr)
        return await body(opened)


async def _context(config: Config, args) -> int:
    from bot.agent.context import assemble
    from bot.app.inspector.source import open_source  # the store, tools and model, no runner

    async with open_source(config) as source:  # looking resumes and claims nothing
        conv = await source.store.get_conversation(args.key)
        request = (await assemble(source.store, config, conv.id, tools=source.tools,
                                  model=source.model)).request
    if args.json:
        print(request.model_dump_json())
        return 0
    print(f"model: {request.model or '(default)'}   tools: "
          f"{', '.join(t.name for t in request.tools) or 'none'}")
    for m in request.messages:
        calls = "".join(f"\n  -> {c.name}({json.dumps(c.arguments)}) [{c.id}]"
                        for c in m.tool_calls)
        label = m.role + (f" [{m.tool_call_id}]" if m.tool_call_id else "")
        print(f"--- {label}\n{m.content}{calls}")
    return 0


async def _compact(config: Config, args) -> int:
    from bot.agent.compact import KIND as COMPACT
    from bot.app import wiring as app
    from store import Writes

    async with app.open_app(config) as opened:
        conv = await opened.store.get_conversation(args.key)
        w = Writes()
        task_id = w.spawn(COMPACT, {"reason": "on demand"}, conversation_id=conv.id)
        await opened.store.commit(w)
        await opened.runner.run(until_idle=True)
        task = await opened.store.get_task(task_id)
        conv = await opened.store.get_conversation(args.key)
    if task.state != "done":
        print(f"steward: compaction {task.state}: {task.error}", file=sys.stderr)
        return 1
    if "skipped" in (task.result or {}):
        print(f"nothing to compact: {task.result['skipped']}")
    else:
        print(f"compacted {args.key} up to entry {task.result['cut']}; "
              f"the summary is entry {conv.head_seq}")
    return 0


async def _ask(config: Config, args) -> int:
    text = " ".join(args.text)
    if not text.strip():
        raise UsageError("nothing to ask: the message is empty")
    from bot.app import chat

    return await _with_app(config, lambda o: chat.ask(o, args.session, text, args.request_id))


async def _run(config: Config, args) -> int:
    from bot.app import wiring

    if args.accept_data_loss:
        await _accept_data_loss(config)
    return await wiring.run_forever(config)


async def _accept_data_loss(config: Config) -> None:
    """`run --accept-data-loss`: an SQLite database behind what its home saw (a deleted
    -wal, store/wal_guard.py) is taken as it is, from now on; said once, on stderr."""
    from store.read.reader import sqlite_path
    from store.wal_guard import accept

    path = sqlite_path(config.store_url)
    if path is not None and (loss := await asyncio.to_thread(accept, path)) is not None:
        print(f"steward: accepted the loss: {loss.detail()}; going on with the database as "
              "it is", file=sys.stderr, flush=True)


async def _resume(config: Config, args) -> int:
    from bot.app import chat

    return await _with_app(config, chat.resume)


async def _chat(config: Config, args) -> int:
    from bot.app import chat

    return await _with_app(config, lambda o: chat.chat(o, args.session))


async def _search(config: Config, args) -> int:
    from bot.memory.retrieval import search_command

    return await search_command(config, args)


async def _export(config: Config, args) -> int:
    from bot.app.export import export_command

    return await export_command(config, args)


async def _import(config: Config, args) -> int:
    from bot.app.importers import import_command

    return await import_command(config, args)


async def _backup(config: Config, args) -> int:
    from bot.app.backup_command import backup_command

    return await backup_command(config, args)


async def _forget(config: Config, args) -> int:
    from bot.app.forget import forget_command

    return await forget_command(config, args)


def _web_token(args) -> str | None:
    """`--token`, else $STEWARD_WEB_TOKEN, if strong enough (else a UsageError); None: a
    random one is made at the start."""
    token = args.token or os.environ.get("STEWARD_WEB_TOKEN")
    if not token:
        return None
    from bot.app.inspector.server import check_token  # aiohttp's web stack: `web` only

    return check_token(token)


async def _web(config: Config, args) -> int:
    from bot.app.inspector.server import serve  # aiohttp's web stack only for this command

    await serve(config, args.host, args.port, args.token)
    return 0


COMMANDS = {
    "run": _run,
    "resume": _resume,
    "ask": _ask,
    "chat": _chat,
    "context": _context,
    "compact": _compact,
    "search": _search,
    "import": _import,
    "export": _export,
    "db": _db, "tasks": _tasks, "sessions": _sessions, "schedules": _schedules, "log": _log,
    "quarantine": _quarantine,
    "usage": _usage,
    "fork": _fork, "doc": _doc, "web": _web, "facts": _facts,
    "backup": _backup,
    "forget": _forget,
}

def _home_origin(args) -> str:
    if args.home:
        return "--home"
    return "$STEWARD_HOME" if os.environ.get("STEWARD_HOME") else ""


def _init(args) -> int:
    from bot.app import init

    return init.run(args)


def _doctor(args) -> int:
    from bot.app import doctor

    return asyncio.run(doctor.run(args))


def _service(args) -> int:
    from bot.app import service

    return service.run(args)


# Commands that read the config themselves: init writes it, doctor reports what is wrong
# with it, service installs what will read it.
def _restore(args) -> int:
    from bot.app.restore import restore_command

    return restore_command(args)


SETUP = {"init": _init, "doctor": _doctor, "service": _service, "restore": _restore}


# Commands that only read, and read of the config only its values (no section's methods):
# the config as last validated is enough for them.
READING = ("sessions", "log", "search", "tasks", "schedules", "quarantine", "usage", "doc",
           "facts")


# The sections whose secrets a command must find set before it starts: what it uses. A
# command not named here uses none (it reads the store); `run` and `resume` serve or deliver
# through every connector, so they need all of them (None).
MODEL = ("llm", "embeddings")
NEEDS: dict[str, tuple[str, ...] | None] = {
    "run": None, "resume": None, "ask": MODEL, "chat": MODEL, "compact": MODEL,
    "context": ("embeddings",), "search": ("embeddings",), "web": ("embeddings",),
    "backup": ("backup",)}


# Commands that only read the store: on a home with no database yet they create none.
# The listings list nothing (and say why on stderr); the others have nothing to show.
LISTINGS = ("sessions", "tasks", "schedules", "quarantine", "usage", "facts")
READ_ONLY = (*LISTINGS, "log", "search", "doc", "context", "export", "web")


def _say_no_database(config, args) -> None:
    path = absent_database(config)
    if path is None:
        return
    line = no_database_line(config, path)
    if args.command not in LISTINGS:
        raise NoDatabase(f"{line} {MADE_BY}")
    print(f"steward: {line}", file=sys.stderr, flush=True)


def _config(args):
    found = locate(args.config, args.home, os.environ, Path.cwd())
    needs = NEEDS.get(args.command, ())
    if args.command in READING and (snapshot := recall(found, os.environ, needs)) is not None:
        return snapshot
    from bot.app.config import load_found

    return load_found(found, os.environ, needs=needs)


def _read_secrets_file() -> None:
    """The service's secrets file, read into this process's environment (which wins)."""
    from bot.app import secrets_file

    for warning in secrets_file.load(os.environ):
        print(f"steward: warning: {warning}", file=sys.stderr, flush=True)


def run(args) -> int:
    """Run the parsed command; its exit code (errors printed as one line)."""
    config = None
    try:
        _read_secrets_file()
        if args.command in SETUP:
            return SETUP[args.command](args)
        config = _config(args)
        check_home(config.home, _home_origin(args))
        if args.command == "web":  # a weak token is refused whatever the home holds
            args.token = _web_token(args)
        if args.command in READ_ONLY:
            _say_no_database(config, args)
        return asyncio.run(COMMANDS[args.command](config, args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        raise  # the reader of stdout left: not an error (bot/app/cli.py)
    except Exception as exc:
        if os.environ.get("STEWARD_DEBUG"):
            raise
        code, line = describe(exc, config)
        print(f"steward: {_without_secrets(line, config)}", file=sys.stderr)
        return code


def _without_secrets(line: str, config: Config | None) -> str:
    """An error's line with every secret taken out: a server's error can echo the key it
    was sent (the config's own secrets by value, anything shaped like one by shape)."""
    from bot.app.config_snapshot import Snapshot
    from bot.redact import redact

    known = ()
    # A reading command's snapshot: by shape only (the secrets' names need the full config,
    # and loading it would cost those commands their fast start).
    if config is not None and not isinstance(config, Snapshot):
        from bot.app.doctor_checks import known_secrets

        try:
            known = known_secrets(config, os.environ)
        except Exception:  # noqa: BLE001 - redact by shape at least
            known = ()
    return redact(line, known)
