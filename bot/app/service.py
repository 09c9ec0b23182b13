"""`steward service install|uninstall|status`: `steward run` kept running by the user's
service manager, a systemd user unit on Linux and a launchd agent on macOS.

The unit restarts Steward when it fails or stops pinging systemd's watchdog (a loop that
ended or hangs: `bot/app/systemd.py`), except on exit 2 (a config error: restarting
cannot fix it; `steward doctor` says what is wrong). Secrets are not in the unit: it reads
an environment file (`~/.config/steward/env`), created 0600 and empty but for comments
naming the variables the config needs; filling it in is the owner's job (every `steward`
command reads it too: bot/app/secrets_file.py). Home and config
are passed as absolute paths, so the service reads what this shell reads.
"""

import getpass
import os
import plistlib
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from bot.app import configfile, secrets_file
from bot.app.errors import UsageError
from bot.app.secrets_file import path as env_file
from bot.app.secrets_file import read as read_env_file

UNIT = "steward.service"
LABEL = "local.steward"  # launchd's job name
SERVICE_COMMAND_SECONDS = 30
WATCHDOG_SECONDS = 60  # the claim loop turns at least twice a second, outages included
START_SECONDS = 900


def unit_path(env=os.environ) -> Path:
    return configfile.user_config_dir(env).parent / "systemd" / "user" / UNIT


def plist_path(env=os.environ) -> Path:
    return Path(env.get("HOME") or Path.home()) / "Library" / "LaunchAgents" / f"{LABEL}.plist"


def executable() -> list[str]:
    """This very Steward: the `steward` script next to this Python (a venv's bin), else
    the interpreter with `-m bot`. The venv's python is a symlink: not resolved, or the
    venv would be lost."""
    python = Path(os.path.abspath(sys.executable))
    script = python.with_name("steward")
    return [str(script)] if script.is_file() else [str(python), "-m", "bot"]


# -- what is written ---------------------------------------------------------------------


def _word(arg: str) -> str:
    """One argument of ExecStart: % and $ doubled (systemd's specifiers and variables),
    quoted when it holds anything but plain path characters."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_unit(command: list[str], *, home: Path, secrets: Path,
                 stop_seconds: float) -> str:
    path_value = lambda p: str(p).replace("%", "%%")  # noqa: E731 - two uses, one line
    return "\n".join([
        "# Written by `steward service install`; `steward service uninstall` removes it.",
        "[Unit]",
        "Description=Steward, a durable personal agent",
        "",
        "[Service]",
        "# Steward says when it serves, and its claim loop pings the watchdog while it",
        "# turns (sd_notify); a Steward that stops pinging is restarted.",
        "Type=notify",
        "NotifyAccess=main",
        f"WatchdogSec={WATCHDOG_SECONDS}",
        "# Start-up applies migrations and resumes interrupted work first.",
        f"TimeoutStartSec={START_SECONDS}",
        f"ExecStart={' '.join(_word(a) for a in command)}",
        f"WorkingDirectory={path_value(home)}",
        "# The secrets, KEY=value lines (0600): never written by Steward.",
        f"EnvironmentFile={path_value(secrets)}",
        "Environment=PYTHONUNBUFFERED=1",
        "UMask=0077",
        "Restart=on-failure",
        "RestartSec=5",
        "# Exit 2 is a config error: restarting cannot fix it (`steward doctor` says what).",
        "RestartPreventExitStatus=2",
        "# SIGTERM drains the work in hand ([runtime] drain_seconds) before exiting.",
        f"TimeoutStopSec={int(stop_seconds)}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ])


def launchd_plist(command: list[str], *, home: Path, secrets: Path) -> bytes:
    # launchd has no environment file: a shell reads it, then becomes Steward.
    script = 'set -a; [ -f "$0" ] && . "$0"; set +a; exec "$@"'
    return plistlib.dumps({
        "Label": LABEL,
        "ProgramArguments": ["/bin/sh", "-c", script, str(secrets), *command],
        "WorkingDirectory": str(home),
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},  # restart when it fails
        "ThrottleInterval": 10,
        "Umask": 0o077,
        "ProcessType": "Background",
        "StandardOutPath": str(home / "steward.log"),
        "StandardErrorPath": str(home / "steward.log"),
    })


# -- the command -------------------------------------------------------------------------


def run(args, env=os.environ) -> int:
    platform = sys.platform
    if platform not in ("linux", "darwin"):
        raise UsageError(f"no service manager support on {platform}: run `steward run` "
                         "under your own (see README, Docker)")
    secrets = env_file(env)
    loaded = configfile.load_lenient(args, {**env, **read_env_file(secrets)})
    config = loaded.config
    command = [*executable(), "run", "--home", str(config.home)]
    if config.path is not None:
        command += ["--config", str(config.path.resolve())]
    darwin = platform == "darwin"
    path = plist_path(env) if darwin else unit_path(env)
    if args.action == "status":
        return _status(path, darwin)
    if args.action == "uninstall":
        return _uninstall(path, darwin, secrets)
    if darwin:
        content = launchd_plist(command, home=config.home, secrets=secrets)
    else:
        content = systemd_unit(command, home=config.home, secrets=secrets,
                               stop_seconds=config.runtime.drain_seconds + 10).encode()
    if args.print_only:
        sys.stdout.write(content.decode())
        return 0
    from bot.app.doctor_checks import needed_secrets
    from bot.home import make_private

    make_private(config.home)  # the service starts in it
    if said := secrets_file.create(secrets, [name for _, name in needed_secrets(config, env)]):
        print(said)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    print(f"wrote {path}")
    unset = f": put {', '.join(loaded.missing)} in it" if loaded.missing else ""
    print(f"secrets file {secrets} (0600){unset}")
    if not args.no_start:
        _start(path, darwin)
    else:
        print("not started (--no-start): " + _start_commands(path, darwin))
    if not darwin:
        print("to keep it running while you are logged out: loginctl enable-linger "
              f"{env.get('USER') or getpass.getuser()}")
    return 0


def _start_commands(path: Path, darwin: bool) -> str:
    if darwin:
        return f"launchctl bootstrap gui/{os.getuid()} {shlex.quote(str(path))}"
    return f"systemctl --user daemon-reload && systemctl --user enable --now {UNIT}"


def _manager(darwin: bool) -> tuple[list[str] | None, str]:
    """The service manager's command, or None and why it cannot be used here."""
    tool = shutil.which("launchctl" if darwin else "systemctl")
    if tool is None:
        return None, f"{'launchctl' if darwin else 'systemctl'} is not installed"
    if darwin:
        return [tool], ""
    probe = _call([tool, "--user", "show-environment"])
    if probe.returncode != 0:
        why = (probe.stderr or probe.stdout).strip().splitlines()
        return None, f"systemctl --user cannot reach a user manager ({why[0] if why else ''})"
    return [tool, "--user"], ""


def _call(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True,
                              timeout=SERVICE_COMMAND_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return subprocess.CompletedProcess(argv, 1, "", str(exc))


def _start(path: Path, darwin: bool) -> None:
    manager, why = _manager(darwin)
    if manager is None:
        print(f"{why}; start it where it is with: {_start_commands(path, darwin)}")
        return
    steps = ([[*manager, "bootstrap", f"gui/{os.getuid()}", str(path)]] if darwin else
             [[*manager, "daemon-reload"], [*manager, "enable", "--now", UNIT]])
    for argv in steps:
        done = _call(argv)
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise UsageError(f"{' '.join(argv[:3])}... failed: {said[0] if said else ''}")
    print(f"started; `steward service status` shows it, "
          f"{'the log is in the home' if darwin else f'journalctl --user -u {UNIT}'} too")


def _uninstall(path: Path, darwin: bool, secrets: Path) -> int:
    if not path.exists():
        print(f"no service installed ({path} does not exist)")
        return 0
    manager, why = _manager(darwin)
    if manager is not None:
        _call([*manager, "bootout", f"gui/{os.getuid()}", str(path)] if darwin else
              [*manager, "disable", "--now", UNIT])
    else:
        print(f"{why}; stop it yourself if it runs")
    path.unlink()
    if manager is not None and not darwin:
        _call([*manager, "daemon-reload"])
    print(f"removed {path}; kept {secrets} (your secrets: delete it if done with them)")
    return 0


def _status(path: Path, darwin: bool) -> int:
    if not path.exists():
        print(f"not installed ({path} does not exist): steward service install")
        return 0
    print(f"installed: {path}")
    manager, why = _manager(darwin)
    if manager is None:
        print(f"state unknown: {why}")
        return 0
    done = _call([*manager, "print", f"gui/{os.getuid()}/{LABEL}"] if darwin else
                 [*manager, "is-active", UNIT])
    said = (done.stdout or done.stderr).strip().splitlines()
    print(f"state: {said[0] if said else '?'}")
    return 0
