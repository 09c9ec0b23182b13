"""`steward service` writes a systemd user unit (a launchd agent on macOS) that runs this
very Steward and restarts it, with its secrets in a private environment file it never
fills in; and the Docker files run `steward run` with the home in a volume. Real
subprocesses; systemd's own checker reads the unit where it is installed."""

import asyncio
import os
import plistlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bot.app import service
from tests.test_cli import steward, steward_env
from tests.test_cli_errors import assert_one_line_error

ROOT = Path(__file__).resolve().parents[1]
SECRET = "xoxb-service-secret-123"


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    return home


def unit_file(home) -> Path:
    return home / "xdg" / "systemd" / "user" / "steward.service"  # steward_env's XDG dir


def env_file(home) -> Path:
    return home / "xdg" / "steward" / "env"


def directives(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def steward_executable() -> str:
    return str(Path(os.path.abspath(sys.executable)).with_name("steward"))


async def test_print_shows_the_unit_and_writes_nothing(home):
    (home / "config.toml").write_text('[slack]\nenabled = true\nallowed_users = ["U0ANN"]\n')
    code, out, err = await steward(home, "service", "install", "--print")
    assert code == 0, err
    unit = directives(out)
    assert unit["ExecStart"] == [f"{steward_executable()} run --home {home} --config "
                                 f"{home / 'config.toml'}"]
    assert unit["Restart"] == ["on-failure"]
    assert unit["RestartPreventExitStatus"] == ["2"]  # a config error: restarting is futile
    # It says when it serves, and its claim loop pings a watchdog (tests/test_run_health.py).
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert int(unit["WatchdogSec"][0]) >= 10
    assert unit["EnvironmentFile"] == [str(env_file(home))]
    assert unit["WorkingDirectory"] == [str(home)]
    assert unit["WantedBy"] == ["default.target"]
    assert int(unit["TimeoutStopSec"][0]) > 20  # more than the drain takes
    assert not unit_file(home).exists() and not env_file(home).exists()


async def test_install_writes_the_unit_and_a_private_empty_secrets_file(home):
    (home / "config.toml").write_text('[slack]\nenabled = true\nallowed_users = ["U0ANN"]\n')
    env = steward_env(home, SLACK_BOT_TOKEN=SECRET)
    code, out, err = await steward(home, "service", "install", "--no-start", env=env)
    assert code == 0, err
    text = unit_file(home).read_text()
    assert directives(text)["ExecStart"][0].startswith(f"{steward_executable()} run --home ")
    secrets = env_file(home)
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    body = secrets.read_text()
    assert SECRET not in body and SECRET not in text  # never copied from the environment
    assert "#SLACK_BOT_TOKEN=" in body and "#SLACK_APP_TOKEN=" in body
    assert all(line.startswith("#") for line in body.splitlines())
    assert "SLACK_APP_TOKEN" in out  # unset: said where to put it
    assert "systemctl --user daemon-reload && systemctl --user enable --now steward.service" \
        in out
    assert "loginctl enable-linger" in out
    assert stat.S_IMODE(home.stat().st_mode) == 0o700

    # the owner fills the file in; a second install keeps it and reads it for the check
    secrets.write_text("SLACK_BOT_TOKEN=xoxb-1\nSLACK_APP_TOKEN=xapp-1\n")
    os.chmod(secrets, 0o644)
    code, out, err = await steward(home, "service", "install", "--no-start")
    assert code == 0, err
    assert secrets.read_text() == "SLACK_BOT_TOKEN=xoxb-1\nSLACK_APP_TOKEN=xapp-1\n"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o600
    assert f"made {secrets} private" in out and "put " not in out


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed on this machine")
async def test_systemd_accepts_the_unit(home):
    code, _, err = await steward(home, "service", "install", "--no-start")
    assert code == 0, err
    done = await asyncio.to_thread(subprocess.run, ["systemd-analyze", "verify",
                                                    str(unit_file(home))],
                                   capture_output=True, text=True, timeout=60)
    # verify exits 0 on mere warnings: any line it prints about the unit is a failure
    complaints = [line for line in (done.stdout + done.stderr).splitlines()
                  if "steward.service" in line]
    assert done.returncode == 0 and not complaints, done.stdout + done.stderr


async def test_without_systemctl_it_says_so_and_what_to_run(home, tmp_path):
    bare = tmp_path / "bin"  # a PATH with no systemctl on it
    bare.mkdir()
    code, out, err = await steward(home, "service", "install",
                                   env=steward_env(home, PATH=str(bare)))
    assert code == 0, err
    assert ("systemctl is not installed; start it where it is with: systemctl --user "
            "daemon-reload && systemctl --user enable --now steward.service") in out
    assert unit_file(home).exists()


@pytest.mark.skipif(shutil.which("systemctl") is None, reason="systemctl is not installed")
async def test_a_systemctl_without_a_user_manager_is_reported(home):
    # No user manager to reach, on any machine (one that has one must not get a service
    # started by a test): the runtime dir and the session bus point at nothing.
    nothing = home / "no-user-manager"
    nothing.mkdir()
    env = steward_env(home, XDG_RUNTIME_DIR=str(nothing),
                      DBUS_SESSION_BUS_ADDRESS=f"unix:path={nothing / 'bus'}")
    code, out, err = await steward(home, "service", "install", env=env)
    assert code == 0, err
    assert "systemctl --user cannot reach a user manager" in out


async def test_status_and_uninstall(home):
    code, out, _ = await steward(home, "service", "status")
    assert code == 0 and "not installed" in out
    assert (await steward(home, "service", "install", "--no-start"))[0] == 0
    code, out, _ = await steward(home, "service", "status")
    assert code == 0 and f"installed: {unit_file(home)}" in out
    code, out, err = await steward(home, "service", "uninstall")
    assert code == 0, err
    assert not unit_file(home).exists() and env_file(home).exists()  # the secrets stay
    assert f"kept {env_file(home)}" in out
    code, out, _ = await steward(home, "service", "uninstall")
    assert code == 0 and "no service installed" in out


async def test_bad_input_is_one_line(home):
    (home / "config.toml").write_text("[slack]\nmode = 'pigeon'\n")
    for args, code, needle in [
        (["service"], 2, "the following arguments are required: action"),
        (["service", "start"], 2, "invalid choice"),
        (["service", "install", "--print"], 2,
         f"{home / 'config.toml'}: [slack] mode: Input should be 'socket' or 'http'"),
    ]:
        assert_one_line_error((args, await steward(home, *args)), code, needle)
    assert not unit_file(home).exists()


def test_paths_with_spaces_and_percent_signs_survive_the_unit_syntax():
    text = service.systemd_unit(["/opt/my apps/steward", "run", "--home", "/srv/100%/h$x"],
                                home=Path("/srv/100%/h"), secrets=Path("/e/env"),
                                stop_seconds=30)
    [line] = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    assert line == 'ExecStart="/opt/my apps/steward" run --home "/srv/100%%/h$$x"'
    assert "WorkingDirectory=/srv/100%%/h" in text


def test_the_launchd_agent_on_macos():
    data = plistlib.loads(service.launchd_plist(
        ["/Users/a/.venv/bin/steward", "run", "--home", "/Users/a/steward"],
        home=Path("/Users/a/steward"), secrets=Path("/Users/a/.config/steward/env")))
    assert data["Label"] == service.LABEL and data["RunAtLoad"] is True
    assert data["KeepAlive"] == {"SuccessfulExit": False}  # restarted when it fails
    shell, flag, script, secrets, *command = data["ProgramArguments"]
    assert (shell, flag, secrets) == ("/bin/sh", "-c", "/Users/a/.config/steward/env")
    assert command == ["/Users/a/.venv/bin/steward", "run", "--home", "/Users/a/steward"]
    # the script reads the secrets file, then becomes Steward: run it here to show it
    done = subprocess.run(["/bin/sh", "-c", script, "/dev/null", "echo", "ran"],
                          capture_output=True, text=True, timeout=10)
    assert done.stdout == "ran\n"


# -- Docker ----------------------------------------------------------------------------------


def test_the_dockerfile_runs_steward_run_with_the_home_in_a_volume():
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0].startswith("FROM python:3.11")
    assert 'ENTRYPOINT ["steward"]' in lines and 'CMD ["run"]' in lines
    assert 'VOLUME ["/data"]' in lines and "STEWARD_HOME=/data \\" in lines
    assert any(line.startswith("USER ") and "root" not in line for line in lines)
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".env", "config.toml", ".venv", "*.db"} <= set(ignored)


def test_compose_has_the_data_volume_and_postgresql_as_a_profile():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    app, db = compose["services"]["steward"], compose["services"]["postgres"]
    assert app["command"] == ["run"] and app["build"] == "."
    assert "steward-home:/data" in app["volumes"] and "steward-home" in compose["volumes"]
    assert app["environment"]["STEWARD_HOME"] == "/data"
    assert "profiles" not in app and db["profiles"] == ["postgres"]
    assert app["depends_on"]["postgres"]["required"] is False  # SQLite alone works
    assert any(v.startswith("steward-pg:") for v in db["volumes"])
    assert app["restart"] == "unless-stopped"
    assert not any("PASSWORD=" in str(v) for v in app.get("environment", {}).values())
