"""The checks of `steward doctor` (bot/app/doctor.py runs them): each takes the shared
context and returns `(status, detail, fix)`; raising is a failed row."""

import asyncio
import math
import os
import sqlite3
import stat
import time
from pathlib import Path

from bot.app.verdicts import FAIL, OK, SKIP, WARN
from bot.attachments import size_label

CLOCK_TOLERANCE = 30.0  # seconds; Slack refuses requests signed 5 minutes off, and
# reminders fire by this clock


def _no_config(ctx):
    return (SKIP, "the config did not load", "") if ctx.config is None else None


# -- secrets and files -------------------------------------------------------------------


def needed_secrets(config, env) -> list[tuple[str, str]]:
    """(what, variable) for each secret the config reads from the environment."""
    needed = []
    llm = config.llm
    if llm.api_key_env:
        needed.append(("[llm] api_key_env", llm.api_key_env))
    elif llm.provider is None and not llm.base_url:  # auto-detected from these
        for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
            if env.get(name):
                needed.append(("the model (detected)", name))
                break
    slack = config.slack
    if slack.enabled:
        needed.append(("[slack] bot_token_env", slack.bot_token_env))
        needed.append(("[slack] app_token_env", slack.app_token_env) if slack.mode == "socket"
                      else ("[slack] signing_secret_env", slack.signing_secret_env))
    email = config.email
    if email.enabled:
        needed.append(("[email] imap_password_env", email.imap_password_env))
        if email.smtp_user:
            needed.append(("[email] smtp_password_env", email.smtp_password_env))
    if config.embeddings.provider == "openai" and config.embeddings.api_key_env:
        needed.append(("[embeddings] api_key_env", config.embeddings.api_key_env))
    return needed


# Read when set whatever the config says, so that a key is never shown even when the config
# did not load or the model was found by these.
ALWAYS_SECRET = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "STEWARD_WEB_TOKEN")


def known_secrets(config, env) -> list[str]:
    """The values of every secret this config and environment hold (the variables it names,
    those an MCP server passes on or sends as headers, the store URL's password), for
    `redact`: a server that echoes one back must not get it printed."""
    names = list(ALWAYS_SECRET)
    values = []
    if config is not None:
        from bot.config import secret_names

        names += [name for _, name in secret_names(config)]
        names += [name for _, name in needed_secrets(config, env)]
        for server in config.mcp.servers:
            names += [*server.headers_env.values(), *server.pass_env]
        if config.store.url:
            from sqlalchemy.engine import make_url
            from sqlalchemy.exc import ArgumentError

            try:
                values.append(make_url(config.store.url).password or "")
            except ArgumentError:  # an unreadable URL: the database check says so
                pass
    from bot.app.configfile import PLACEHOLDER

    values += (env.get(name) or "" for name in names if name)
    return [v for v in dict.fromkeys(values) if v and v != PLACEHOLDER]


async def secrets(ctx):
    if skipped := _no_config(ctx):
        return skipped
    needed = needed_secrets(ctx.config, ctx.env)
    if ctx.missing:
        from bot.app.secrets_file import path as env_file

        names = ", ".join(dict.fromkeys(ctx.missing))
        return (FAIL, f"not set: {names}",
                f"put {ctx.missing[0]}=... in {env_file(ctx.env)} (0600), which the service "
                "and every steward command read, or export it in the shell")
    if not needed:
        return OK, "none needed by this config", ""
    return OK, "set: " + ", ".join(dict.fromkeys(name for _, name in needed)), ""


async def permissions(ctx):
    if skipped := _no_config(ctx):
        return skipped
    return await asyncio.to_thread(_permissions, ctx.config.home, ctx.env)


def _permissions(home: Path, env) -> tuple[str, str, str]:
    from bot.app.secrets_file import path as env_file

    if not home.exists():
        return OK, f"home {home} not created yet (made 0700 at the first start)", ""
    if not home.is_dir():
        return FAIL, f"home {home} is not a directory", "point --home / $STEWARD_HOME at one"
    info = home.stat()
    if info.st_uid != os.geteuid():
        return FAIL, f"home {home} belongs to another user", f"chown -R $USER {home}"
    loose = [home] if info.st_mode & 0o077 else []
    for entry in os.scandir(home):
        if entry.is_file(follow_symlinks=False) and entry.stat().st_mode & 0o077:
            loose.append(Path(entry.path))
    secrets_file = env_file(env)
    if secrets_file.exists() and secrets_file.stat().st_mode & 0o077:
        loose.append(secrets_file)
    if loose:
        shown = ", ".join(f"{p} {stat.S_IMODE(p.stat().st_mode):04o}" for p in loose[:4])
        more = f" and {len(loose) - 4} more" if len(loose) > 4 else ""
        fix = " && ".join(f"chmod {'700' if p.is_dir() else '600'} {p}" for p in loose[:4])
        return FAIL, f"readable by others: {shown}{more}", fix + (
            " (any steward command tightens the home's own files)" if more else "")
    return OK, f"home {home} 0700, its files 0600", ""


# -- who Steward answers -----------------------------------------------------------------


async def people(ctx):
    """The ids and addresses the config names, as `init` checks them (a config written by
    hand may hold a name where a member id belongs), and a connector that answers nobody."""
    if skipped := _no_config(ctx):
        return skipped
    from bot.app import addresses

    config = ctx.config
    listed = []  # (where, values, check)
    if config.slack.enabled:
        listed.append(("[slack] allowed_users", config.slack.allowed_users,
                       addresses.member_id_problem))
    if config.email.enabled:
        listed += [("[email] address", [config.email.address], addresses.address_problem),
                   ("[email] allowed_senders", config.email.allowed_senders,
                    addresses.sender_problem)]
    listed.append(("[agent] allowed_recipients", config.agent.allowed_recipients,
                   addresses.sender_problem))
    wrong = [f"{where}: {problem}" for where, values, check in listed for value in values
             if (problem := check(value))]
    if wrong:
        fix = "correct them in " + (str(config.path) if config.path else "the config")
        if any(w.startswith("[slack]") for w in wrong):
            fix += f" (a member id: {addresses.MEMBER_ID_HOW})"
        return FAIL, "; ".join(wrong), fix
    said, nobody = [], []
    for name, section, key in (("Slack", config.slack, "allowed_users"),
                               ("mail", config.email, "allowed_senders")):
        if not section.enabled:
            continue
        if section.allow_everyone:
            said.append(f"{name} answers everyone (allow_everyone = true)")
        elif values := getattr(section, key):
            said.append(f"{name} answers {', '.join(values)}")
        else:
            table = "slack" if name == "Slack" else "email"
            said.append(f"{name} answers nobody ([{table}] {key} is empty)")
            nobody.append(f"[{table}] {key}")
    if not said:
        return OK, "no Slack or mail: the terminal only", ""
    if nobody:
        return WARN, "; ".join(said), f"list who Steward answers in {' and '.join(nobody)}"
    return OK, "; ".join(said), ""


# -- the running service -----------------------------------------------------------------

STALE_HEALTH = 30.0  # seconds without a new health.json: the process is stuck
STALLED_LOOP = 120.0  # seconds a loop may go without a turn (its turns take < 1 s)


async def running(ctx):
    """What the `steward run` on this home says of its loops (home/health.json, written
    every 2 s while it serves: bot/runtime/supervision.py)."""
    if skipped := _no_config(ctx):
        return skipped
    from bot.runtime.supervision import read_health

    health = await asyncio.to_thread(read_health, ctx.config.home)
    return judge_health(health, time.time())


def judge_health(health: dict | None, now: float) -> tuple[str, str, str]:
    if not health:
        return OK, "`steward run` is not running on this home", ""
    pid = health.get("pid")
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, TypeError, ValueError):
        return WARN, f"the last `steward run` (pid {pid}) is gone without stopping cleanly", \
            "start it again: `steward run`, or `systemctl --user start steward`"
    except PermissionError:
        pass  # alive, another user's
    restart = "restart it: `systemctl --user restart steward` (or stop and run it again)"
    quiet = now - float(health.get("updated_at") or 0)
    if quiet > STALE_HEALTH:
        return FAIL, f"`steward run` (pid {pid}) has said nothing for {quiet:.0f} s: it is " \
            "stuck", restart
    loops = health.get("loops") or {}
    for name, loop in loops.items():
        if loop.get("state") != "ok":
            since = now - float(loop.get("outage_since") or now)
            return WARN, f"`steward run` (pid {pid}): {name} waiting for the store for " \
                f"{since:.0f} s ({loop.get('error')}); it goes on by itself when the store " \
                "is back", "check the database server and the free space under the home"
        stalled = now - float(loop.get("last_progress") or 0)
        if name in ("runner", "scheduler") and stalled > STALLED_LOOP:
            return FAIL, f"`steward run` (pid {pid}): the {name} loop has not turned for " \
                f"{stalled:.0f} s", restart
    waited = sum(int(loop.get("outages") or 0) for loop in loops.values())
    note = f"; {waited} store outage(s) waited out since it started" if waited else ""
    connected = health.get("connected") or {}
    if connected:
        note += "; " + ", ".join(f"{name} {'connected' if up else 'connecting'}"
                                 for name, up in connected.items())
    return OK, f"`steward run` (pid {pid}) serving: {', '.join(loops) or 'no loops'} ok{note}", ""


# -- the database ------------------------------------------------------------------------


async def database(ctx):
    if skipped := _no_config(ctx):
        return skipped
    from sqlalchemy.engine import make_url

    url = make_url(ctx.config.store_url)
    if url.get_backend_name() == "sqlite":
        return await asyncio.to_thread(_sqlite, Path(url.database))
    return await _postgres(ctx.config.store_url, url)


def _revision_says(revision: str | None) -> tuple[str, str, str] | None:
    from store.revision import HEAD

    if revision is None:
        return OK, "no tables yet (made at the first start)", ""
    if revision > HEAD:
        return (FAIL, f"at revision {revision}, newer than this build knows ({HEAD})",
                "upgrade Steward: a newer version wrote this database")
    return None


def _sqlite(path: Path) -> tuple[str, str, str]:
    """Read-only, through the standard library: doctor never creates or migrates it."""
    from store.revision import HEAD
    from store.wal_guard import inspect

    try:
        loss = inspect(path)  # behind what the home saw: a -wal deleted after a crash
    except sqlite3.Error:  # damage: said below
        loss = None
    if loss is not None:
        return FAIL, loss.detail(), loss.remedy()
    if not path.exists():
        return OK, f"{path} not created yet (made at the first start)", ""
    recover = (f"stop Steward, keep a copy, then `sqlite3 {path} .recover | sqlite3 "
               "recovered.db` (or restore a backup)")
    try:
        revision, result = _read_sqlite(path)
    except sqlite3.OperationalError as exc:  # locked, unreadable: not damage
        return FAIL, f"{path}: {exc}", "check the file's owner and mode, and what holds it"
    except sqlite3.DatabaseError as exc:  # "file is not a database", "malformed"
        return FAIL, f"{path}: {exc}", recover
    size = sum(p.stat().st_size for p in (path, path.with_name(path.name + "-wal"))
               if p.exists())
    if result != ["ok"]:
        return FAIL, f"{path}: integrity check: {'; '.join(result[:3])}", recover
    said = _revision_says(revision)
    if said is not None:
        return said
    behind = "" if revision == HEAD else f"; migrated to {HEAD} at the next start"
    return OK, f"SQLite {path}, revision {revision}{behind}, integrity ok, {size_label(size)}", ""


def _read_sqlite(path: Path) -> tuple[str | None, list[str]]:
    """(its revision, what integrity_check says), opened read-only."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = row[0] if row else None
        except sqlite3.OperationalError:  # no such table: never opened by Steward
            revision = None
        return revision, [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    finally:
        conn.close()


async def _postgres(url_text: str, url) -> tuple[str, str, str]:
    from sqlalchemy import text

    from store.engine import create_engines
    from store.revision import HEAD, current

    engines = create_engines(url_text)
    try:
        revision = await current(engines)
        async with engines.read.connect() as conn:
            size = (await conn.execute(text(
                "SELECT pg_database_size(current_database())"))).scalar()
    finally:
        await engines.dispose()
    said = _revision_says(revision)
    if said is not None:
        return said
    behind = "" if revision == HEAD else f"; migrated to {HEAD} at the next start"
    where = f"{url.host or 'localhost'}:{url.port or 5432}/{url.database}"
    return OK, f"PostgreSQL {where}, revision {revision}{behind}, {size_label(size or 0)}", ""


# -- the model ---------------------------------------------------------------------------


async def model(ctx):
    if skipped := _no_config(ctx):
        return skipped
    from bot.llm.errors import LLMError
    from bot.llm.factory import make_client
    from bot.llm.types import Message, Request

    key_env = ctx.config.llm.api_key_env
    if key_env and key_env in ctx.missing:
        return SKIP, f"{key_env} is not set (see secrets)", ""
    client, banner = await make_client(ctx.config.llm, env=ctx.env, http=ctx.http)
    if banner:
        return (WARN, "no model configured: the offline demo model answers",
                "`steward init`, or set OPENAI_API_KEY / ANTHROPIC_API_KEY, or run Ollama")
    if client.provider == "scripted":
        return OK, "the offline demo model ([llm] provider = \"scripted\")", ""
    facts = await _capacity(ctx, client)
    started = time.monotonic()
    first: list[float] = []

    async def on_text(_delta: str) -> None:
        if not first:
            first.append(time.monotonic() - started)

    try:
        reply = await client.stream(Request(model=client.model, max_tokens=8, messages=[
            Message(role="user", content="Reply with the word OK.")]), on_text)
    except LLMError as exc:
        return FAIL, f"{client.provider} {client.model}: {exc}", _model_fix(exc, ctx)
    took = time.monotonic() - started
    # The first answer's time includes loading the model, for a local server that had
    # unloaded it: what the first message after a quiet spell waits.
    timing = f"first answer after {first[0]:.1f} s, done in {took:.1f} s" if first \
        else f"answered in {took:.1f} s"
    said = f"{client.provider} {client.model}: {timing} " \
        f"({reply.usage.input_tokens} + {reply.usage.output_tokens} tokens)"
    from bot.app.wiring import build_toolbox

    every = (await build_toolbox(ctx.config)).specs() if facts is not None else []
    status, notes, fix = _capacity_row(ctx.config, facts, every)
    return status, "; ".join([*notes[:1], said, *notes[1:]]) if status != OK \
        else "; ".join([said, *notes]), fix


async def _capacity(ctx, client):
    """What the model's server says of it (bot/llm/discovery.py), or None for a hosted
    provider, which is not asked."""
    from bot.agent.capacity import kind_of
    from bot.llm.discovery import discover

    kind = kind_of(client)
    if kind is None:
        return None
    facts = await discover(ctx.http, client.base_url, client.model, kind)
    ctx.config.llm.learn(context_tokens=facts.context_tokens, tools=facts.tools)
    return facts


TOOLS_DROPPED = "this model's template drops tools: memory and reminders will not work"


def _capacity_row(config, facts, every) -> tuple[str, list[str], str]:
    """(status, notes, fix) on the model's context size and tools: what it can hold and
    whether memory, reminders and to-dos can work with it at all (`every`: the tools
    Steward offers)."""
    from bot.agent.context import TOOLS_SHARE, offered_tools, tools_chars
    from bot.memory.transcript import CHARS_PER_TOKEN

    llm = config.llm
    if facts is None:
        return OK, [f"context {llm.window:,} tokens ([llm] context_window)"], ""
    if facts.context_tokens:
        lowered = " (lower than [llm] context_window: requests are made for it)" \
            if facts.context_tokens < llm.context_window else ""
        notes = [f"context {facts.context_tokens:,} tokens ({facts.source}){lowered}"]
    else:
        notes = [f"context {llm.window:,} tokens assumed ([llm] context_window): the server "
                 "does not say; an overflow error will"]
    if facts.tools is False:
        return WARN, [TOOLS_DROPPED, *notes], (
            "run llama-server with --jinja and a template that renders tools "
            "(--chat-template-file), or pick a model whose template does (Ollama: "
            "`ollama show` lists \"tools\" under its capabilities)")
    if not offered_tools(config, every):
        # The window whose prompt part (four fifths) gives the tools their share.
        need = 2 ** math.ceil(math.log2(tools_chars(every) / CHARS_PER_TOKEN / TOOLS_SHARE
                                        * 5 / 4))
        return WARN, ["the window is too small for the tools: memory and reminders will "
                      "not work", *notes], (
            f"give the server a larger context (at least {need:,} tokens: llama-server -c, "
            "Ollama num_ctx or OLLAMA_CONTEXT_LENGTH)")
    if facts.tools:
        notes.append(f"tools reach the model ({facts.source})")
    return OK, notes, ""


def _model_fix(exc, ctx) -> str:
    from bot.llm import errors

    llm = ctx.config.llm
    if isinstance(exc, errors.AuthError):
        return f"the provider refused the key in {exc.key_env or llm.api_key_env}: check it"
    if isinstance(exc, errors.StreamError):
        return "check the network and [llm] base_url" + (f" ({llm.base_url})"
                                                          if llm.base_url else "")
    if isinstance(exc, errors.RateLimited):
        return "the provider is limiting this key: check its plan or credit, or wait"
    if isinstance(exc, errors.ServerError):
        return "the provider is in trouble: try again later, or add [[llm.fallbacks]]"
    return "check [llm] model and base_url"


# -- Slack -------------------------------------------------------------------------------


async def slack(ctx):
    if skipped := _no_config(ctx):
        return skipped
    config = ctx.config.slack
    if not config.enabled:
        return SKIP, "[slack] enabled = false", ""
    if config.bot_token_env in ctx.missing:
        return SKIP, f"{config.bot_token_env} is not set (see secrets)", ""
    import httpx

    from bot.app.slack_manifest import bot_scopes

    base = config.api_base_url.rstrip("/") + "/"
    try:
        response = await ctx.http.post(base + "auth.test", headers={
            "authorization": f"Bearer {ctx.env[config.bot_token_env]}"})
    except httpx.HTTPError as exc:
        return (FAIL, f"cannot reach {base}: {describe(exc, ctx)}",
                "check the network and [slack] api_base_url")
    body = _slack_body(response)
    if not body.get("ok"):
        return (FAIL, f"auth.test: {body.get('error', f'HTTP {response.status_code}')}",
                f"the bot token in {config.bot_token_env} is wrong or revoked: copy the Bot "
                "User OAuth Token (xoxb-...) again from the app's Install App page")
    who = f"{body.get('team', '?')} as @{body.get('user', '?')}"
    header = response.headers.get("x-oauth-scopes")
    granted = {s.strip() for s in (header or "").split(",") if s.strip()}
    lacking = [s for s in await asyncio.to_thread(bot_scopes) if s not in granted]
    if header is not None and lacking:
        return (FAIL, f"{who}; the token lacks the scopes {', '.join(lacking)}",
                "add them under OAuth & Permissions (or paste docs/slack-manifest.yaml "
                "again), then reinstall the app to the workspace")
    if config.mode == "socket" and config.app_token_env not in ctx.missing:
        opened = _slack_body(await ctx.http.post(base + "apps.connections.open", headers={
            "authorization": f"Bearer {ctx.env[config.app_token_env]}"}))
        if not opened.get("ok"):
            return (FAIL, f"{who}; apps.connections.open: {opened.get('error', '?')}",
                    f"{config.app_token_env} must be an App-Level Token (xapp-...) with "
                    "connections:write, and Socket Mode on")
    if header is None:
        return (WARN, f"{who}; Slack did not say which scopes the token has",
                "compare OAuth & Permissions with docs/slack-manifest.yaml")
    mode = "Socket Mode" if config.mode == "socket" else "HTTP mode"
    return OK, f"{who}, {mode}, all {len(granted)} scopes granted", ""


def _slack_body(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {"ok": False, "error": f"HTTP {response.status_code}, not JSON"}
    return body if isinstance(body, dict) else {"ok": False, "error": "not a JSON object"}


# -- mail --------------------------------------------------------------------------------


async def imap(ctx):
    if skipped := _no_config(ctx):
        return skipped
    config = ctx.config.email
    if not config.enabled:
        return SKIP, "[email] enabled = false", ""
    if config.imap_password_env in ctx.missing:
        return SKIP, f"{config.imap_password_env} is not set (see secrets)", ""
    from connectors.email.imap import ImapError, ImapSession

    user = config.imap_user or config.address
    where = f"{user} at {config.imap_host}:{config.imap_port} ({config.imap_security})"
    try:
        async with ImapSession(host=config.imap_host, port=config.imap_port,
                               security=config.imap_security, user=user,
                               password=ctx.env[config.imap_password_env],
                               timeout=ctx.timeout) as session:
            idle = session.can_idle
            found = {name: await session.exists(name)
                     for name in (config.mailbox, config.sent_mailbox)}
            names = await _mailboxes(session) if not all(found.values()) else []
    except (OSError, TimeoutError) as exc:
        return (FAIL, f"{where}: cannot connect: {describe(exc, ctx)}",
                "check [email] imap_host, imap_port and imap_security")
    except ImapError as exc:
        return (FAIL, f"{where}: {exc}", f"check [email] imap_user and the password in "
                f"{config.imap_password_env} (with most providers an app password)")
    absent = [name for name, there in found.items() if not there]
    if absent:
        listed = ", ".join(f'"{n}"' for n in names[:8]) or "none listed"
        return (FAIL, f"{where}: logged in; no mailbox {', '.join(absent)}",
                f"set [email] mailbox / sent_mailbox to one of the server's: {listed}")
    if not idle:
        return (WARN, f"{where}: logged in; no IDLE, so Steward polls every "
                f"{config.poll_seconds:g} s", "lower [email] poll_seconds for faster answers")
    return OK, f"{where}: logged in, IDLE, {config.mailbox} and {config.sent_mailbox}", ""


async def _mailboxes(session) -> list[str]:
    response = await session.client.list('""', "*")
    names = []
    for line in response.lines[:-1]:
        if isinstance(line, bytes) and line.startswith(b"("):
            names.append(line.rsplit(b" ", 1)[-1].decode("utf-7", "replace").strip('"'))
    return names


async def smtp(ctx):
    if skipped := _no_config(ctx):
        return skipped
    config = ctx.config.email
    if not config.enabled:
        return SKIP, "[email] enabled = false", ""
    import aiosmtplib

    where = f"{config.smtp_host}:{config.smtp_port} ({config.smtp_security})"
    client = aiosmtplib.SMTP(hostname=config.smtp_host, port=config.smtp_port,
                             use_tls=config.smtp_security == "ssl",
                             start_tls=config.smtp_security == "starttls",
                             timeout=ctx.timeout)
    await client.connect()
    try:
        if client.last_ehlo_response is None:
            await client.ehlo()
        offered = sorted(client.esmtp_extensions)
        if not config.smtp_user:
            return (OK, f"{where}: EHLO ok ({', '.join(offered)}); no login (smtp_user "
                    "empty)", "")
        if config.smtp_password_env in ctx.missing:
            return SKIP, f"{config.smtp_password_env} is not set (see secrets)", ""
        try:
            await client.login(config.smtp_user, ctx.env[config.smtp_password_env])
        except aiosmtplib.SMTPException as exc:
            return (FAIL, f"{where}: login as {config.smtp_user}: {exc}",
                    f"check [email] smtp_user and the password in {config.smtp_password_env}")
        return OK, f"{where}: EHLO ok, logged in as {config.smtp_user}", ""
    finally:
        try:
            await client.quit()
        except (aiosmtplib.SMTPException, OSError):
            client.close()


# -- what bounds spend ------------------------------------------------------------------


async def limits(ctx):
    """`[limits]`: the spending caps and the per-person rate (bot/agent/budget.py)."""
    if skipped := _no_config(ctx):
        return skipped
    from bot.agent.budget import summary

    config = ctx.config
    caps = config.limits
    if not caps.limited:
        return (WARN, "no spending cap and no hourly rate: nothing bounds model calls",
                "set [limits] daily_limit and person_calls_per_hour (0 is off; "
                "config.example.toml has the defaults)")
    llm = config.llm
    unpriced = llm.provider != "scripted" and not (llm.input_price_per_mtok
                                                   or llm.output_price_per_mtok)
    money = any((caps.daily_limit, caps.monthly_limit, caps.person_daily_limit,
                 caps.person_monthly_limit))
    note = "; [llm] sets no prices: the caps count only a cost the provider reports" \
        if money and unpriced else ""
    return OK, summary(caps) + note, ""


# -- the clock ---------------------------------------------------------------------------


async def clock(ctx):
    if not ctx.dates:
        return SKIP, "no server answered to compare with", ""
    host, theirs, ours = max(ctx.dates, key=lambda d: abs(d[1] - d[2]))
    skew = ours - theirs  # a Date header is cut to the second: ±1 s is nothing
    if abs(skew) > CLOCK_TOLERANCE:
        side = "ahead of" if skew > 0 else "behind"
        return (FAIL, f"this machine is {abs(skew):.0f} s {side} {host}",
                "turn on time sync (timedatectl set-ntp true, or chrony / ntpd)")
    return OK, f"within {max(abs(skew), 1):.0f} s of {host}", ""


# -- failures ----------------------------------------------------------------------------


def describe(exc: BaseException, ctx) -> str:
    """One line for an exception that ended a check."""
    from bot.app.problems import database_problem

    said = database_problem(exc, ctx.config)
    if said is not None:
        return said
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


FIXES = {
    "database": "is the database server running, and [store] url right?",
    "model": "check the network and [llm] base_url",
    "slack": "check the network and [slack] api_base_url",
    "imap": "check [email] imap_host, imap_port and imap_security",
    "smtp": "check [email] smtp_host, smtp_port and smtp_security",
}


def fix_for(name: str, ctx) -> str:
    return FIXES.get(name, "")
