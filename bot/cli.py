"""The `steward` command line (also `python -m bot`). Contract in DESIGN.md."""

import argparse
import asyncio
import json
import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from bot import app, chat
from bot.agent.context import build_request
from bot.config import Config, ConfigError, load_config
from bot.importers import import_command
from bot.memory.compaction import KIND as COMPACT
from bot.memory.facts import facts_for
from bot.memory.recall import recall
from bot.memory.search import search_command
from store import STATES, StoreError, Writes, conversation_namespace
from store.engine import create_engines, migrate

DEFAULT_SESSION = "cli:default"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="steward", description="A durable personal agent.")
    p.add_argument("--home", help="data directory (env STEWARD_HOME)")
    p.add_argument("--config", help="config file (env STEWARD_CONFIG)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    # The same options after the command (`steward log KEY --home H`); SUPPRESS keeps a
    # value given before the command when they are not repeated after it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)
    subparsers = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    class sub:  # noqa: N801 - reads like the subparsers object it wraps
        @staticmethod
        def add_parser(name, **kw):
            return subparsers.add_parser(name, parents=[common], **kw)

    sub.add_parser("run", help="resume interrupted work, then serve until SIGTERM")
    sub.add_parser("resume", help="finish all interrupted or pending work, then exit")
    chat = sub.add_parser("chat", help="talk to the agent in the terminal")
    chat.add_argument("--session", default=DEFAULT_SESSION)
    ask = sub.add_parser("ask", help="one message; print the reply; exit")
    ask.add_argument("--session", default=DEFAULT_SESSION)
    ask.add_argument("--request-id", help="asking twice with the same id answers once")
    ask.add_argument("text", nargs="+")
    db = sub.add_parser("db", help="database maintenance")
    db.add_argument("action", choices=["upgrade"])

    def listing(name, help_):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--json", action="store_true", help="one JSON object per line")
        sp.add_argument("--limit", type=int, default=50)
        return sp

    context = sub.add_parser("context", help="the exact context the model would get now")
    context.add_argument("key")
    context.add_argument("--json", action="store_true")
    search = sub.add_parser("search", help="full-history search")
    search.add_argument("query", nargs="+")
    search.add_argument("--session", help="only this conversation")
    search.add_argument("--limit", type=int, default=10)
    search.add_argument("--json", action="store_true", help="one JSON object per line")
    imports = sub.add_parser("import", help="bring existing history in (idempotent)")
    imports.add_argument("file")
    imports.add_argument("--format", choices=["jsonl", "slack", "mbox"],
                         help="default: guessed from the file")
    imports.add_argument("--json", action="store_true", help="print the summary as JSON")
    compact = sub.add_parser("compact", help="summarise a conversation's old history now")
    compact.add_argument("key")
    tasks = listing("tasks", "tasks by state")
    tasks.add_argument("--state", choices=STATES)
    listing("sessions", "conversations, newest first")
    quarantine = listing("quarantine", "inbound messages that could not be processed")
    quarantine.add_argument("--channel", help="e.g. email or slack")
    schedules = listing("schedules", "reminders and recurring jobs")
    schedules.add_argument("--all", action="store_true", help="also finished and cancelled")
    log = listing("log", "a page of a transcript")
    log.add_argument("key")
    log.add_argument("--before", type=int, help="entries before this position")
    fork = sub.add_parser("fork", help="fork a conversation")
    fork.add_argument("key")
    fork.add_argument("--at", type=int, help="entry position (default: the newest)")
    fork.add_argument("--as", dest="new_key", help="key of the fork")
    doc = sub.add_parser("doc", help="read a conversation's document")
    doc.add_argument("key")
    doc.add_argument("name")
    doc.add_argument("--as-of", type=int, help="as it was at this entry position")
    doc.add_argument("--json", action="store_true")
    return p


def _ts(t: float) -> str:
    """ISO-8601 in UTC, as the JSONL import format and search results have it."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def _emit(rows: list[dict], as_json: bool, columns: list[str]) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False, default=str))
        return
    for row in rows:
        print("  ".join(str(row.get(c, "")) for c in columns))


async def _tasks(config: Config, args) -> int:
    async with app.opened_store(config) as store:
        found = await store.list_tasks(state=args.state, limit=args.limit)
    rows = [{"id": t.id, "kind": t.kind, "state": t.state, "phase": t.phase,
             "attempts": t.attempts, "parent": t.parent_id, "error": t.error,
             "updated": _ts(t.updated_at)} for t in found]
    _emit(rows, args.json, ["id", "kind", "state", "phase", "attempts", "error"])
    return 0


async def _schedules(config: Config, args) -> int:
    async with app.opened_store(config) as store:
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
             "prompt": s.prompt} for s in found]
    _emit(rows, args.json, ["id", "state", "next", "name", "session"])
    return 0


async def _quarantine(config: Config, args) -> int:
    async with app.opened_store(config) as store:
        found = await store.list_submissions(state="quarantined", channel=args.channel,
                                             limit=args.limit)
    rows = [{"channel": q["channel"], "external_id": q["external_id"], "reason": q["reason"],
             "ts": _ts(q["created_at"])} for q in found]
    _emit(rows, args.json, ["ts", "channel", "external_id", "reason"])
    return 0


async def _sessions(config: Config, args) -> int:
    async with app.opened_store(config) as store:
        found = await store.list_conversations(limit=args.limit)
    rows = [{"key": c.key, "entries": c.last_seq, "owner": c.owner,
             "parent": c.parent_id, "fork_at": c.fork_at, "updated": _ts(c.updated_at)}
            for c in found]
    _emit(rows, args.json, ["key", "entries", "updated"])
    return 0


async def _log(config: Config, args) -> int:
    async with app.opened_store(config) as store:
        conv = await store.get_conversation(args.key)
        page = await store.entries_page(conv.id, before=args.before, limit=args.limit)
    rows = [{"session": args.key, "entry": e.seq, "kind": e.kind, "role": e.kind,
             "author": e.author,
             "text": e.text, "ts": _ts(e.created_at), "ref": e.ref, "data": e.data}
            for e in page]
    if args.json:
        _emit(rows, True, [])
        return 0
    for r in rows:
        calls = "".join(f" -> {c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})"
                        for c in (r["data"] or {}).get("tool_calls", []))
        author = f" {r['author']}" if r["author"] else ""
        print(f"[{r['entry']}] {r['ts']} {r['kind']}{author}: {r['text']}{calls}")
    return 0


async def _fork(config: Config, args) -> int:
    async with app.opened_store(config) as store:
        parent = await store.get_conversation(args.key)
        at = parent.last_seq if args.at is None else args.at
        child = await store.fork(args.key, args.new_key or f"{args.key}@{at}", at_seq=at)
    print(child.key)
    return 0


async def _doc(config: Config, args) -> int:
    async with app.opened_store(config) as store:
        conv = await store.get_conversation(args.key)
        doc = await store.read_document(conversation_namespace(conv.id), args.name,
                                        as_of_seq=args.as_of)
    if args.json:
        print(json.dumps({"session": args.key, "name": args.name, "version": doc.version,
                          "at": doc.at_seq, "value": doc.value}, ensure_ascii=False))
    else:
        print(json.dumps(doc.value, indent=2, ensure_ascii=False))
    return 0


async def _db(config: Config, args) -> int:
    engines = create_engines(config.store_url)
    try:
        await migrate(engines)
    finally:
        await engines.dispose()
    print("database is up to date")
    return 0


async def _with_app(config: Config, body) -> int:
    async with app.open_app(config) as opened:
        if opened.banner:
            print(opened.banner, file=sys.stderr)
        return await body(opened)


async def _context(config: Config, args) -> int:
    async with app.open_app(config) as opened:
        conv = await opened.store.get_conversation(args.key)
        facts = await facts_for(opened.store, conv.id, config.compaction.facts_chars)

        async def recalled(conversation, said, seen):
            return await recall(opened.store, conversation, said, in_window=seen)

        request = (await build_request(opened.store, config, conv.id,
                                       tools=opened.deps.toolbox.specs(),
                                       model=opened.deps.client.model, facts=facts,
                                       recall=recalled)).request
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


COMMANDS = {
    "run": lambda c, a: app.run_forever(c),
    "resume": lambda c, a: _with_app(c, chat.resume),
    "ask": lambda c, a: _with_app(c, lambda o: chat.ask(o, a.session, " ".join(a.text),
                                                        a.request_id)),
    "chat": lambda c, a: _with_app(c, lambda o: chat.chat(o, a.session)),
    "context": _context,
    "compact": _compact,
    "search": search_command,
    "import": import_command,
    "db": _db, "tasks": _tasks, "sessions": _sessions, "schedules": _schedules, "log": _log,
    "quarantine": _quarantine,
    "fork": _fork, "doc": _doc,
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(args.config, args.home, os.environ, Path.cwd())
        return asyncio.run(COMMANDS[args.command](config, args))
    except (ConfigError, StoreError, ValueError) as exc:
        if os.environ.get("STEWARD_DEBUG"):
            raise
        print(f"steward: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
