"""The `steward` command line (also `python -m bot`). Contract in DESIGN.md.

Every error a person can run into is one line on stderr, `steward: <what>`, exit 2 for a
usage or config problem and 1 for anything else (130 after Ctrl-C); no traceback, unless
STEWARD_DEBUG is set (then the exception is raised, as tests and bug reports want it).

This module is the parser alone, on the standard library: `--help`, `--version` and a
mistyped command answer before anything else is imported. The commands are in
`bot/app/commands.py`, imported once the arguments are read.
"""

import argparse
import logging
import os
import sys

# httpx's package imports its own command-line tool when click, rich and pygments are
# installed (they are here: rich draws `import`'s progress, click comes with uvicorn);
# Steward never runs httpx's tool, and loading it costs ~0.2 s of every start. Marking the
# module absent makes httpx fall back to its stub, as it does when they are not installed.
sys.modules.setdefault("httpx._main", None)

DEFAULT_SESSION = "cli:default"
KEY_HELP = "the conversation's key (`steward sessions` lists them)"
# `store.STATES`, spelled out so that the parser needs no database code (a test keeps the
# two the same).
TASK_STATES = ("pending", "running", "waiting", "done", "failed", "interrupted", "blocked")


class _Version(argparse.Action):
    """`--version`: looked up only when asked (start-up time matters)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):  # noqa: A002 - argparse's own keyword
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, _option_string=None):
        from bot.app.installed import version

        print(f"steward {version()}")
        parser.exit()


def _at_least(low: int):
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more, not {n}")
        return n
    parse.__name__ = "number"  # what argparse calls the type in its messages
    return parse


_positive = _at_least(1)
_position = _at_least(0)


def _port(text: str) -> int:
    n = _position(text)
    if n > 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {n}")
    return n


def _key(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("a session key cannot be empty")
    return text


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="steward", description="A durable personal agent.")
    p.add_argument("--version", action=_Version, help="print the version and exit")
    p.add_argument("--home", help="data directory (env STEWARD_HOME)")
    p.add_argument("--config", help="config file, or the directory holding config.toml "
                   "(env STEWARD_CONFIG)")
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
            """A command: its `help` is its line in `steward --help` and, unless it has a
            longer `description`, the first line of its own page."""
            kw.setdefault("description", _sentence(kw.get("help", "")))
            return subparsers.add_parser(name, parents=[common], **kw)

    run = sub.add_parser(
        "run", help="resume interrupted work, then serve until SIGTERM",
        description="Serve: resume what the last process left, then answer Slack and mail "
        "and fire schedules until Ctrl-C or SIGTERM (which finish the work in hand first). "
        "It keeps the terminal; use a second one for the other commands, or `steward "
        "service install` to run it as a service.")
    run.add_argument("--accept-data-loss", action="store_true",
                     help="start although the SQLite database lost commits this home saw "
                     "(a deleted -wal after a crash): go on with it as it is")
    sub.add_parser("resume", help="finish all interrupted or pending work, then exit")
    session_help = f"the conversation's key (default {DEFAULT_SESSION}; any name starts one)"
    chat = sub.add_parser("chat", help="talk to the agent in the terminal",
                          description="Talk to Steward in the terminal, answers streamed as "
                          "they are written; an empty line or Ctrl-D ends it.")
    chat.add_argument("--session", type=_key, default=DEFAULT_SESSION, help=session_help)
    ask = sub.add_parser("ask", help="one message; print the reply; exit")
    ask.add_argument("--session", type=_key, default=DEFAULT_SESSION, help=session_help)
    ask.add_argument("--request-id", help="asking twice with the same id answers once")
    ask.add_argument("text", nargs="+", help="the message (several words need no quotes)")
    db = sub.add_parser("db", help="database maintenance")
    db.add_argument("action", choices=["upgrade"],
                    help="upgrade: migrate to this version's schema now (every start does it "
                    "too)")
    db.add_argument("--no-snapshot", action="store_true",
                    help="migrate without a snapshot first (only after backing the "
                    "database up yourself, e.g. where pg_dump is missing)")

    def listing(name, help_):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--json", action="store_true", help="one JSON object per line")
        sp.add_argument("--limit", type=_positive, default=50,
                        help="at most this many rows (default %(default)s)")
        return sp

    facts = sub.add_parser("facts", help="what Steward remembers, per scope, and where each "
                                         "fact came from")
    facts.add_argument("--scope", help="one scope (private:<person>, channel:<id>); default all")
    facts.add_argument("--json", action="store_true", help="one JSON object per line")
    context = sub.add_parser("context", help="the exact context the model would get now")
    context.add_argument("key", help=KEY_HELP)
    context.add_argument("--json", action="store_true", help="the request as JSON")
    search = sub.add_parser("search", help="full-history search",
                            description="Search every conversation's whole history, "
                            "summarised parts included; best matches first.")
    search.add_argument("query", nargs="+", help="words to look for")
    search.add_argument("--session", help="only this conversation")
    search.add_argument("--limit", type=_positive, default=10,
                        help="at most this many hits (default %(default)s)")
    search.add_argument("--json", action="store_true", help="one JSON object per line")
    imports = sub.add_parser(
        "import", help="bring existing history in (idempotent)",
        description="Bring existing history in: Steward's own JSONL (what export writes), "
        "a Slack export (.zip or its folder) or an mbox. Running it again adds only what "
        "is missing, so an interrupted import is simply run again.")
    imports.add_argument("file", help="the file (or an unpacked Slack export's folder)")
    imports.add_argument("--format", choices=["jsonl", "slack", "mbox"],
                         help="default: guessed from the file")
    imports.add_argument("--json", action="store_true", help="print the summary as JSON")
    export = sub.add_parser("export", help="conversations as JSONL that import reads back, "
                            "plus Markdown, documents and attachments")
    whose = export.add_mutually_exclusive_group()
    whose.add_argument("--session", type=_key, help="one conversation (default: all)")
    whose.add_argument("--person", help="one person's: private to them or owned by them")
    export.add_argument("--to", metavar="PATH", help="a new directory (default: "
                        "./steward-export-<date>)")
    export.add_argument("--json", action="store_true", help="print the summary as JSON")
    compact = sub.add_parser("compact", help="summarise a conversation's old history now")
    compact.add_argument("key", help=KEY_HELP)
    tasks = listing("tasks", "tasks by state")
    tasks.add_argument("--state", choices=TASK_STATES, help="only tasks in this state")
    listing("sessions", "conversations, newest first")
    quarantine = listing("quarantine", "inbound messages that could not be processed")
    quarantine.add_argument("--channel", help="e.g. email or slack")
    schedules = listing("schedules", "reminders and recurring jobs")
    schedules.add_argument("--all", action="store_true", help="also finished and cancelled")
    usage = listing("usage", "what the model cost, by person, model and day")
    usage.add_argument("--days", type=_positive, default=30, help="this many days back")
    log = listing("log", "a page of a transcript")
    log.description = ("A page of a conversation's transcript, oldest first: the newest "
                       "entries, or those before --before.")
    log.add_argument("key", help=KEY_HELP)
    log.add_argument("--before", type=_position, help="entries before this position")
    fork = sub.add_parser("fork", help="fork a conversation",
                          description="Start a new conversation that shares this one's "
                          "history up to an entry; the original goes on unchanged.")
    fork.add_argument("key", help=KEY_HELP)
    fork.add_argument("--at", type=_position, help="entry position (default: the newest)")
    fork.add_argument("--as", dest="new_key", help="key of the fork")
    doc = sub.add_parser("doc", help="read a conversation's document")
    doc.add_argument("key", help=KEY_HELP)
    doc.add_argument("name", help="the document's name (e.g. todo)")
    doc.add_argument("--as-of", type=_position, help="as it was at this entry position")
    doc.add_argument("--json", action="store_true",
                     help="with its version and position, as one JSON object")
    web = sub.add_parser("web", help="the inspector in a browser (read-only)")
    web.add_argument("--host", default="127.0.0.1", help="address to bind")
    web.add_argument("--port", type=_port, default=8377,
                     help="port to listen on (default %(default)s; 0: any free one)")
    web.add_argument("--token", help="required of every request, 16 characters or more "
                     "(default: a random one each start, in the printed link); also "
                     "$STEWARD_WEB_TOKEN")
    backup = sub.add_parser("backup", help="an online, verified snapshot of the home "
                            "(while `run` keeps answering)")
    backup.add_argument("--to", metavar="DIR", help="where (default: [backup] dir, else "
                        "<home>/backups)")
    backup.add_argument("--verify", metavar="BACKUP", help="check a backup instead of "
                        "taking one")
    backup.add_argument("--json", action="store_true", help="print the result as JSON")
    forget = sub.add_parser("forget", help="remove a conversation or a person everywhere, "
                            "space reclaimed (a dry run lists what goes)")
    gone = forget.add_mutually_exclusive_group(required=True)
    gone.add_argument("--session", help="one conversation (with its forks)")
    gone.add_argument("--person", help="a person's id: their private and owned "
                      "conversations, their messages elsewhere, facts, schedules, blobs")
    forget.add_argument("--dry-run", action="store_true", help="list what would go; "
                        "change nothing")
    forget.add_argument("-y", "--yes", action="store_true", help="do not ask for a yes")
    _setup_commands(sub)
    return p


def _setup_commands(sub) -> None:
    """`init`, `doctor`, `service` and `restore`: setting Steward up on a machine."""
    restore = sub.add_parser("restore", help="a backup into a new home that catches up "
                             "without repeating or losing anything")
    restore.add_argument("backup", help="the backup's directory (steward-backup-...)")
    # --home (every command's): the new home, absent or empty
    restore.add_argument("--identity", help="an age identity file, for an encrypted backup")
    restore.add_argument("--passphrase-env", metavar="NAME",
                         help="the variable holding an encrypted backup's passphrase")
    restore.add_argument("--store-url", metavar="URL",
                         help="for a PostgreSQL backup: the empty database to restore into")
    init = sub.add_parser(
        "init", help="write config.toml, asking on a terminal (or --yes with flags)",
        description="Write config.toml: the model, Slack, email and who may talk to "
        "Steward. Secrets stay in environment variables; the file only names them.")
    init.add_argument("-y", "--yes", action="store_true",
                      help="ask nothing: take the flags, detected values and defaults")
    init.add_argument("--force", action="store_true", help="replace an existing file")
    init.add_argument("--print", dest="print_only", action="store_true",
                      help="print the config instead of writing it")
    model = init.add_argument_group("model")
    model.add_argument("--provider", choices=PROVIDERS,
                       help="default: detected (an API key in the environment, a local "
                       "Ollama or llama-server), else auto")
    model.add_argument("--model", help="model name (default: the provider's)")
    model.add_argument("--base-url", help="an OpenAI-compatible server (provider compatible)")
    model.add_argument("--api-key-env", help="the variable holding the API key")
    model.add_argument("--ollama-url", default="http://127.0.0.1:11434",
                       help="where to look for Ollama (default %(default)s)")
    model.add_argument("--llamacpp-url", default="http://127.0.0.1:8080",
                       help="where to look for llama.cpp's llama-server (default %(default)s)")
    model.add_argument("--timezone", help="your IANA timezone (default: this machine's)")
    slack = init.add_argument_group("Slack")
    slack.add_argument("--slack", choices=("off", "socket", "http"),
                       help="socket: no public URL needed (default when on); http: Slack "
                       "posts to --slack-url")
    slack.add_argument("--slack-url", help="public https URL of /slack/events (http mode)")
    slack.add_argument("--slack-bot-token-env", default="SLACK_BOT_TOKEN", metavar="NAME",
                       help="the variable holding the bot token, xoxb-... (default "
                       "%(default)s)")
    slack.add_argument("--slack-app-token-env", default="SLACK_APP_TOKEN", metavar="NAME",
                       help="the variable holding the app-level token, xapp-... (Socket "
                       "Mode; default %(default)s)")
    slack.add_argument("--slack-signing-secret-env", default="SLACK_SIGNING_SECRET",
                       metavar="NAME", help="the variable holding the signing secret (HTTP "
                       "mode; default %(default)s)")
    slack.add_argument("--slack-users", type=_listed, default=None, metavar="U1,U2",
                       help="member ids Steward answers (Slack: profile, Copy member ID)")
    mail = init.add_argument_group("email")
    mail.add_argument("--email", choices=("off", *EMAIL_PRESETS),
                      help="a provider's IMAP/SMTP settings, or custom (--imap-host, "
                      "--smtp-host)")
    mail.add_argument("--email-address", metavar="ADDRESS", help="Steward's own mailbox")
    mail.add_argument("--email-user", metavar="LOGIN", help="default: the address")
    mail.add_argument("--email-password-env", default="STEWARD_EMAIL_PASSWORD",
                      metavar="NAME", help="the variable holding the (app) password")
    mail.add_argument("--imap-host", metavar="HOST", help="IMAP server (default: the "
                      "provider's)")
    mail.add_argument("--smtp-host", metavar="HOST", help="SMTP server (default: the "
                      "provider's)")
    mail.add_argument("--email-senders", type=_listed, default=None,
                      metavar="A,@DOMAIN", help="who Steward answers by mail")

    doctor = sub.add_parser("doctor", help="check config, secrets, database, model, Slack, "
                            "mail and the clock; a fix for each failure")
    doctor.add_argument("--json", action="store_true", help="one JSON object per check")
    doctor.add_argument("--timeout", type=_seconds, default=10.0,
                        help="seconds each network check may take (default %(default)s)")

    service = sub.add_parser("service", help="run `steward run` as a service that restarts "
                             "(systemd user unit; launchd on macOS)")
    service.add_argument("action", choices=("install", "uninstall", "status"),
                         help="install: write the unit and start it; uninstall: stop and "
                         "remove it (the secrets file stays); status: is it running")
    service.add_argument("--print", dest="print_only", action="store_true",
                         help="show what would be written; change nothing")
    service.add_argument("--no-start", action="store_true",
                         help="write the files, do not enable or start the service")


# `steward init`'s choices, spelled out here so that parsing imports nothing (a test keeps
# them equal to bot.app.presets).
PROVIDERS = ("auto", "openai", "anthropic", "ollama", "llamacpp", "compatible", "demo")
EMAIL_PRESETS = ("gmail", "fastmail", "icloud", "outlook", "custom")


def _sentence(text: str) -> str:
    """A command's one-line help as the first line of its page."""
    return text[:1].upper() + text[1:] + ("." if text and not text.endswith(".") else "")


def _listed(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 600 seconds, not {text}")
    return value


SIGPIPE_EXIT = 128 + 13  # what a shell shows for a program that SIGPIPE ended


def main(argv: list[str] | None = None) -> int:
    os.umask(0o077)  # whatever this process creates is its owner's alone (DESIGN: 0700/0600)
    try:
        args = _parser().parse_args(argv)
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        if args.command in ("ask", "chat") and not args.verbose:
            # the terminal says itself why the model gave no answer (see bot.app.chat)
            logging.getLogger("bot.agent.apology").setLevel(logging.ERROR)
        from bot.app import commands  # the rest of Steward, now that a command is to run

        code = commands.run(args)
        sys.stdout.flush()  # here, where a reader that left is caught, not at exit
        return code
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """Whoever read stdout has stopped (`steward sessions | head -2`): end quietly, as
    `seq` or `cat` do, with the status a shell shows for them. What is still buffered for
    stdout goes nowhere, so that Python does not complain at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return SIGPIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
