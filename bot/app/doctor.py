"""`steward doctor`: is everything Steward needs in place and answering?

Each check is one row: ok, warn (works, but not as well as it could), fail (with the fix)
or skip (not configured, or waiting on a check that failed). Every check has a time limit
and turns any exception into a failed row, so an unreachable server is a line in the
table, never a traceback. Checks that talk to servers run at the same time; the clock is
read last, from the Date headers of the servers the others reached.

No secret is printed: every row is redacted (`bot.redact.redact`) of the values the
config reads and of anything shaped like a key, since a server's error may echo the key.

Exit code: 0 when nothing failed, 2 when the config itself did not load (as every other
command), 1 for any other failure; the failures are also summed up in one line on stderr.
"""

import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

from bot.app import configfile
from bot.app import doctor_checks as checks
from bot.app.backup_schedule import backup_check
from bot.app.doctor_checks import FAIL, OK, WARN
from bot.redact import redact

DATABASE_SECONDS = 60.0  # integrity_check reads the whole file


@dataclass
class Row:
    check: str
    status: str
    detail: str
    fix: str = ""
    seconds: float = 0.0


@dataclass
class Context:
    """What the checks share: the config (None if it did not load), the unset secrets,
    the environment, the secrets' values (never to be shown), one HTTP client, and the
    Date headers its responses carried."""

    args: object
    env: dict
    timeout: float
    config: object = None
    missing: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)
    http: object = None
    dates: list[tuple[str, float, float]] = field(default_factory=list)  # (host, theirs, ours)


async def run(args, env=os.environ) -> int:
    import httpx

    ctx = Context(args=args, env=dict(env), timeout=args.timeout)
    rows = [await asyncio.to_thread(_config_row, ctx)]  # reads the file: off the loop
    ctx.known = checks.known_secrets(ctx.config, ctx.env)
    async with httpx.AsyncClient(timeout=httpx.Timeout(ctx.timeout),
                                 event_hooks={"response": [_date_recorder(ctx)]}) as http:
        ctx.http = http
        rows.append(await _timed("secrets", checks.secrets, ctx, ctx.timeout))
        rows.append(await _timed("permissions", checks.permissions, ctx, ctx.timeout))
        rows.append(await _timed("people", checks.people, ctx, ctx.timeout))
        rows.append(await _timed("service", checks.running, ctx, ctx.timeout))
        rows.append(await _timed("limits", checks.limits, ctx, ctx.timeout))
        rows.append(await _timed("backup", backup_check, ctx, ctx.timeout))
        rows += await asyncio.gather(
            _timed("database", checks.database, ctx, DATABASE_SECONDS),
            _timed("model", checks.model, ctx, ctx.timeout),
            _timed("slack", checks.slack, ctx, ctx.timeout),
            _timed("imap", checks.imap, ctx, ctx.timeout),
            _timed("smtp", checks.smtp, ctx, ctx.timeout))
    rows.append(await _timed("clock", checks.clock, ctx, ctx.timeout))
    rows = [Row(r.check, r.status, redact(r.detail, ctx.known), redact(r.fix, ctx.known),
                r.seconds) for r in rows]  # what any server said: without the keys
    _show(rows, args.json)
    failed = [r for r in rows if r.status == FAIL]
    if failed:
        print(f"steward: {len(failed)} of {len(rows)} checks failed: "
              + "; ".join(f"{r.check}: {r.detail}" for r in failed), file=sys.stderr)
    return 0 if not failed else 2 if rows[0].status == FAIL else 1


def _config_row(ctx: Context) -> Row:
    try:
        loaded = configfile.load_lenient(ctx.args, ctx.env)
    except configfile.ConfigError as exc:
        fix = (f"edit {exc.path} (or `steward init --force` writes a new one)" if exc.path
               else "check --config / $STEWARD_CONFIG, or write one with `steward init`")
        return Row("config", FAIL, str(exc), fix)
    ctx.config, ctx.missing = loaded.config, loaded.missing
    where = str(ctx.config.path) if ctx.config.path else "no file: the defaults " \
        "(`steward init` writes one)"
    return Row("config", OK, where)


def _date_recorder(ctx: Context):
    from email.utils import parsedate_to_datetime

    async def record(response) -> None:
        date = response.headers.get("date")
        if not date:
            return
        try:
            theirs = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            return
        ctx.dates.append((response.request.url.host, theirs, time.time()))
    return record


async def _timed(name: str, check, ctx: Context, limit: float) -> Row:
    started = time.monotonic()
    try:
        async with asyncio.timeout(limit):
            status, detail, fix = await check(ctx)
    except TimeoutError:
        status, detail, fix = FAIL, f"no answer within {limit:g} s", checks.fix_for(name, ctx)
    except Exception as exc:  # a check must never end doctor: it is one failed row
        status, detail, fix = FAIL, checks.describe(exc, ctx), checks.fix_for(name, ctx)
    detail = " ".join(str(detail).split())  # one line per row, whatever a server said
    return Row(name, status, detail, fix, round(time.monotonic() - started, 3))


def _show(rows: list[Row], as_json: bool) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(asdict(row), ensure_ascii=False))
        return
    width = max(len(r.check) for r in rows)
    print(f"{'CHECK'.ljust(width)}  RESULT  DETAIL")
    for r in rows:
        print(f"{r.check.ljust(width)}  {r.status.upper() if r.status == FAIL else r.status:<6}"
              f"  {r.detail}")
        if r.fix and r.status in (FAIL, WARN):
            print(f"{''.ljust(width)}  {'':<6}  fix: {r.fix}")
