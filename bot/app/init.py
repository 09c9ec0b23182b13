"""`steward init`: write config.toml, asking on a terminal or taking flags with `--yes`.

The file names environment variables and never holds a secret: tokens and passwords go in
the secrets file (`~/.config/steward/env`, made here 0600 with their names; the service and
every command read it: bot/app/secrets_file.py) or the environment, which wins.
What is already on the machine is offered first: an API key in the environment, a local
Ollama. The text is checked by the config loader before it is written, so what `init`
writes is what `steward run` accepts.
"""

import asyncio
import os
import sys
from collections.abc import Callable
from pathlib import Path

from bot.app import addresses, configfile, presets, secrets_file, slack_manifest
from bot.app.errors import UsageError
from bot.app.toml_text import Table, render
from bot.config_source import CONFIG_NAME
from bot.home import write_private


class Prompter:
    """Questions on a terminal; without one (`--yes`) every answer is its default."""

    def __init__(self, interactive: bool, out=sys.stdout, read: Callable[[], str] = input):
        self.interactive = interactive
        self.out = out  # what init tells the person (stderr when stdout is the config)
        self._read = read

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def ask(self, question: str, default: str = "",
            check: Callable[[str], str | None] | None = None) -> str:
        """The answer; `check` says what is wrong with one (None: nothing), and the
        question is asked again with that line."""
        while True:
            answer = self._answer(question, default)
            problem = check(answer) if check is not None and answer else None
            if problem is None:
                return answer
            if not self.interactive:  # a default that is wrong: no one to ask again
                raise UsageError(f"{question}: {problem}")
            self.say(f"  {problem}")

    def _answer(self, question: str, default: str) -> str:
        if not self.interactive:
            return default
        shown = f" [{default}]" if default else ""
        try:
            self.out.write(f"{question}{shown}: ")
            self.out.flush()
            answer = self._read().strip()
        except EOFError:
            raise UsageError("init stopped: no answer (end of input)") from None
        return answer or default

    def choose(self, question: str, choices: dict[str, str], default: str) -> str:
        if not self.interactive:
            return default
        self.say(f"\n{question}")
        for key, label in choices.items():
            self.say(f"  {key:<11} {label}")
        while True:
            answer = self.ask("choose", default)
            if answer in choices:
                return answer
            self.say(f"  one of: {', '.join(choices)}")

    def listed(self, question: str, default: list[str] | None,
               check: Callable[[str], str | None] | None = None) -> list[str]:
        """A comma-separated answer as a list; `check` as for `ask`, for each item."""
        def first_problem(text: str) -> str | None:
            return next(filter(None, map(check, _items(text))), None) if check else None

        return _items(self.ask(question, ", ".join(default or []), first_problem))


def _items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _flag(value, name: str, check: Callable[[str], str | None]):
    """A flag's value (a text or a list), refused in one line if `check` finds a
    problem in it."""
    for item in [value] if isinstance(value, str) else value or []:
        if problem := check(item):
            raise UsageError(f"{name}: {problem}")
    return value


def run(args, env=os.environ) -> int:
    interactive = not args.yes
    if interactive and not sys.stdin.isatty():
        raise UsageError("init asks its questions on a terminal; without one, use --yes "
                         "and flags (steward init --help)")
    target = _target(args, env)
    if not args.print_only:
        _refuse_to_overwrite(target, args, env)
    ask = Prompter(interactive, out=sys.stderr if args.print_only else sys.stdout)
    if interactive:
        ask.say(f"Steward set-up: writes {target} (secrets stay in environment variables; "
              "Enter takes the [default]).")
    tables, secrets = [], []
    tables += _model(args, ask, env, secrets)
    tables += _slack(args, ask, secrets)
    tables += _email(args, ask, secrets)
    tables += _limits()
    text = render(tables, header=[
        "Steward's config (written by `steward init`). Secrets are not in this file: it",
        "names the environment variables that hold them. See config.example.toml for every",
        "key, and `steward doctor` to check that everything works."])
    config = _check(text, target, args, env)
    if args.print_only:
        print(text, end="")
        return 0
    _write(target, text)
    _report(target, secrets, env, config.limits)
    return 0


def _secrets_file(names: list[str], env) -> str:
    """Where the secrets go: the one file the service and every command read, made here
    (0600, the names commented out) when this config needs any and it is not there yet."""
    file = secrets_file.path(env)
    if names and not file.exists():
        secrets_file.create(file, names)
        return f"{file} (made now, 0600: fill in the values)"
    return str(file)


def _target(args, env) -> Path:
    if args.config:
        path = Path(args.config).expanduser()
        path = path if path.is_absolute() else Path.cwd() / path
        return path / CONFIG_NAME if path.is_dir() else path  # as the loader reads --config
    return configfile.default_path(env)


def _refuse_to_overwrite(target: Path, args, env) -> None:
    if target.is_dir():
        raise UsageError(f"{target} is a directory; name a file with --config")
    if not target.exists() or args.force:
        return
    try:
        configfile.load_lenient(_Args(str(target), args.home), env)
    except configfile.ConfigError as exc:
        raise UsageError(f"{exc} (the file already exists: fix it, or `steward init "
                         "--force` writes a new one)") from None
    raise UsageError(f"{target} already exists (`steward doctor` checks it); --force "
                     "replaces it")


class _Args:
    def __init__(self, config: str | None, home: str | None):
        self.config, self.home = config, home


# -- the model -------------------------------------------------------------------------


def _detected(args, env) -> tuple[str, dict[str, list[tuple[str, int | None]]]]:
    """(the provider to offer first, the models each local server found lists, with their
    context sizes: {"ollama": [(model, tokens)], "llamacpp": [...]})."""
    found = asyncio.run(local_servers(args))
    if env.get("OPENAI_API_KEY"):
        return "openai", found
    if env.get("ANTHROPIC_API_KEY"):
        return "anthropic", found
    return next((kind for kind in ("ollama", "llamacpp") if found[kind]), "auto"), found


async def local_servers(args) -> dict[str, list[tuple[str, int | None]]]:
    """What a local Ollama and llama-server answer now (each asked only when the choice is
    still open or is that one), with what each model can hold."""
    import httpx

    from bot.llm.discovery import discover
    from bot.llm.factory import listed_models, ollama_models

    found: dict[str, list[tuple[str, int | None]]] = {"ollama": [], "llamacpp": []}
    open_choice = args.provider in (None, "auto")
    async with httpx.AsyncClient() as http:
        if open_choice or args.provider == "ollama":
            url = f"{args.ollama_url.rstrip('/')}/v1"
            for model in (await ollama_models(http, args.ollama_url))[:MODELS_SIZED]:
                facts = await discover(http, url, model, "ollama")
                found["ollama"].append((model, facts.context_tokens))
        if open_choice or args.provider == "llamacpp":
            url = f"{args.llamacpp_url.rstrip('/')}/v1"
            facts = await discover(http, url, "", "llamacpp")
            if facts.context_tokens:
                models = list(facts.models) or await listed_models(http, url) or ["default"]
                found["llamacpp"] = [(m, facts.context_tokens) for m in models]
    return found


MODELS_SIZED = 12  # the most of a local Ollama's models whose context size init asks


def _sized(models: list[tuple[str, int | None]]) -> dict[str, str]:
    return {m: f"{n:,} tokens of context" if n else "" for m, n in models}


def _model(args, ask: Prompter, env, secrets: list[str]) -> list[Table]:
    offered, found = _detected(args, env)
    ollama, llamacpp = found["ollama"], found["llamacpp"]
    labels = {
        "auto": "decide at each start: a key in the environment, a local Ollama, else the "
                "offline demo",
        "openai": "OpenAI" + (" (OPENAI_API_KEY is set)" if env.get("OPENAI_API_KEY") else ""),
        "anthropic": "Anthropic" + (" (ANTHROPIC_API_KEY is set)"
                                    if env.get("ANTHROPIC_API_KEY") else ""),
        "ollama": f"Ollama at {args.ollama_url}" + (f" ({len(ollama)} models)" if ollama
                                                     else " (not answering now)"),
        "llamacpp": f"llama.cpp's llama-server at {args.llamacpp_url}" + (
            f" ({llamacpp[0][0]}, {llamacpp[0][1]:,} tokens of context)" if llamacpp
            else " (not answering now)"),
        "compatible": "another OpenAI-compatible server (vLLM, LM Studio, OpenRouter...)",
        "demo": "the offline demo model (no provider)",
    }
    choice = args.provider or ask.choose("Which model should Steward use?", labels, offered)
    provider, model, key_env, base_url = presets.PROVIDERS[choice]
    if choice in ("ollama", "llamacpp"):
        url, models = (args.ollama_url, ollama) if choice == "ollama" \
            else (args.llamacpp_url, llamacpp)
        if not models and not args.model:
            start = "ollama serve" if choice == "ollama" else "llama-server -m MODEL.gguf"
            raise UsageError(f"no {'Ollama' if choice == 'ollama' else 'llama-server'} "
                             f"answered at {url}: start it ({start}), or name the model "
                             "with --model")
        base_url = f"{url.rstrip('/')}/v1"
        model = args.model or ask.choose(f"Which {choice} model?", _sized(models),
                                         models[0][0])
        tokens = dict(models).get(model)
        if tokens:
            ask.say(f"{choice}: {model}, {tokens:,} tokens of context (asked of the server "
                    "at every start; [llm] context_window is only an upper bound)")
    elif choice == "compatible":
        base_url = args.base_url or ask.ask("Its base URL (ending in /v1)")
        if not base_url:
            raise UsageError("provider compatible needs --base-url (the server's /v1 URL)")
        model = args.model or ask.ask("Model name")
        key_env = args.api_key_env if args.api_key_env is not None else ask.ask(
            "Variable holding its API key (empty: none)")
    elif choice in ("openai", "anthropic"):
        model = args.model or ask.ask("Model", model)
        key_env = args.api_key_env or ask.ask("Variable holding the API key", key_env)
    llm = Table("llm")
    if provider:
        llm["provider"] = provider
    if model and choice != "auto":
        llm["model"] = model
    if base_url:
        llm["base_url"] = base_url
    if key_env and choice != "auto":
        llm["api_key_env"] = key_env
        secrets.append(key_env)
    if choice == "auto":
        llm.comment = "no provider: Steward picks one at every start (see README)"
    agent = Table("agent")
    agent["timezone"] = args.timezone or ask.ask("Your timezone", local_timezone())
    return [llm, agent]


def local_timezone() -> str:
    """This machine's IANA timezone name, else UTC. `TZ` counts only as a zone name
    (not ":/etc/localtime" or a path into zoneinfo)."""
    from bot.tools.base import known_timezone

    if zone := known_timezone(os.environ.get("TZ", "").lstrip(":")):
        return zone
    try:
        link = os.readlink("/etc/localtime")
    except OSError:
        return "UTC"
    return link.split("zoneinfo/", 1)[1] if "zoneinfo/" in link else "UTC"


# -- Slack -----------------------------------------------------------------------------


def _slack(args, ask: Prompter, secrets: list[str]) -> list[Table]:
    mode = args.slack or ask.choose("Connect Slack?", {
        "off": "no", "socket": "yes, Socket Mode (no public URL needed)",
        "http": "yes, HTTP mode (Slack posts to a public https URL)"}, "off")
    if mode == "off":
        return []
    url = ""
    if mode == "http":
        url = args.slack_url or ask.ask("Public URL Slack will post to", slack_manifest
                                        .URL_PLACEHOLDER)
    ask.say("\nCreate the Slack app: https://api.slack.com/apps -> Create New App -> From an "
          "app manifest -> pick the workspace -> paste this manifest:\n")
    ask.say(slack_manifest.manifest(mode, url))
    token = "an App-Level Token with connections:write (Basic Information)" \
        if mode == "socket" else "the Signing Secret (Basic Information)"
    ask.say(f"Then install it to the workspace: the Bot User OAuth Token (xoxb-...), and {token}."
          " Put them in the environment under the names below.\n")
    slack = Table("slack")
    slack["enabled"] = True
    slack["mode"] = mode
    slack["bot_token_env"] = ask.ask("Variable for the bot token", args.slack_bot_token_env)
    secrets.append(slack["bot_token_env"])
    if mode == "socket":
        slack["app_token_env"] = ask.ask("Variable for the app token", args.slack_app_token_env)
        secrets.append(slack["app_token_env"])
    else:
        slack["signing_secret_env"] = ask.ask("Variable for the signing secret",
                                              args.slack_signing_secret_env)
        secrets.append(slack["signing_secret_env"])
        slack.comment = "Slack posts to http://http_host:http_port/slack/events (behind your " \
                        "https proxy)"
    users = _flag(args.slack_users, "--slack-users", addresses.member_id_problem)
    slack["allowed_users"] = users if users is not None else ask.listed(
        "Member ids Steward answers (Slack: your profile, ..., Copy member ID), comma-separated",
        [], addresses.member_id_problem)
    return [slack]


# -- email -----------------------------------------------------------------------------


def _email(args, ask: Prompter, secrets: list[str]) -> list[Table]:
    choices = {"off": "no", **{k: p.label for k, p in presets.EMAIL_PRESETS.items()}}
    name = args.email or ask.choose("Connect a mailbox of Steward's own?", choices, "off")
    if name == "off":
        return []
    preset = presets.EMAIL_PRESETS[name]
    address = _flag(args.email_address, "--email-address", addresses.address_problem) \
        or ask.ask("Steward's email address", check=addresses.address_problem)
    if not address:
        raise UsageError("email needs --email-address (Steward's own mailbox)")
    imap_host = args.imap_host or preset.imap[0] or ask.ask("IMAP server")
    smtp_host = args.smtp_host or preset.smtp[0] or ask.ask("SMTP server")
    if not (imap_host and smtp_host):
        raise UsageError(f"email {name} needs --imap-host and --smtp-host")
    user = args.email_user or ask.ask("Login", address)
    if preset.note:
        ask.say(f"  {preset.label}: the password is {preset.note}.")
    password_env = ask.ask("Variable holding the password", args.email_password_env)
    email = Table("email")
    email.comment = f"{preset.label}; one password for IMAP and SMTP"
    email.update(enabled=True, address=address, imap_host=imap_host, imap_port=preset.imap[1],
                 imap_security=preset.imap[2], imap_user=user, imap_password_env=password_env,
                 sent_mailbox=preset.sent_mailbox, smtp_host=smtp_host,
                 smtp_port=preset.smtp[1], smtp_security=preset.smtp[2], smtp_user=user,
                 smtp_password_env=password_env)
    senders = _flag(args.email_senders, "--email-senders", addresses.sender_problem)
    email["allowed_senders"] = senders if senders is not None else ask.listed(
        "Who may write to Steward (addresses or @domain), comma-separated", [],
        addresses.sender_problem)
    secrets.append(password_env)
    return [email]


# -- limits ----------------------------------------------------------------------------


def _limits() -> list[Table]:
    """The defaults that bound spend, written out so that the owner sees and can change
    them (bot/config.py says why these numbers)."""
    from bot.config import DEFAULT_CALLS_PER_HOUR, DEFAULT_DAILY_USD

    limits = Table("limits", "what the model may cost, 0 = off: everyone together a day "
                   "(the ledger's cost), model calls an hour per person")
    limits.update(daily_limit=DEFAULT_DAILY_USD, person_calls_per_hour=DEFAULT_CALLS_PER_HOUR)
    return [limits]


# -- checking and writing --------------------------------------------------------------


def _check(text: str, target: Path, args, env):
    """Load `text` as Steward will; a problem here is a bug in init or a bad flag."""
    return configfile.check_text(text, target, args.home, env)


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(target, text, sync=True)


def _report(target: Path, secrets: list[str], env, limits) -> None:
    from bot.agent import budget

    print(f"\nwrote {target}")
    print(f"limits: {budget.summary(limits)} ([limits] in it; 0 is off)")
    names = list(dict.fromkeys(secrets))
    unset = [n for n in names if not env.get(n)]
    if names:
        print("secrets it reads: " + ", ".join(
            f"{n}{' (not set now)' if n in unset else ''}" for n in names))
        print(f"put them in {_secrets_file(names, env)}, which the service and every "
              "steward command read (or export them in the shell)")
    print("next: `steward doctor` checks it all; `steward service install` keeps "
          "`steward run` running")
