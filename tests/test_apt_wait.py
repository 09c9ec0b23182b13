"""scripts/apt.sh's `apt_get`, which the test command's installs use: it waits while another
apt holds apt's locks (a second test run, unattended-upgrades after a boot) instead of
failing, reports any other failure at once, and does not hand the install scripts' own
lock to what apt starts.

The `apt-get` here is a stand-in program on PATH that answers the way apt-get 2.6 does:
the first calls fail with apt's own lock messages, then it succeeds. Holding the machine's
real apt locks would need root and would stall any other install on the machine.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FAKE_APT = r"""#!/usr/bin/env bash
# a stand-in apt-get: fails with apt's lock message while $STATE/busy counts down
echo "$*" >> "$STATE/calls"
if [ -e "/proc/$$/fd/9" ]; then echo inherited >> "$STATE/fd9"; fi
busy="$(cat "$STATE/busy" 2>/dev/null || echo 0)"
if [ "$busy" -gt 0 ]; then
  echo $((busy - 1)) > "$STATE/busy"
  echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4479 (apt-get)" >&2
  echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
  exit 100
fi
if [[ "$*" == *no-such-package* ]]; then
  echo "E: Unable to locate package no-such-package" >&2
  exit 100
fi
exit 0
"""


def run_apt_get(tmp_path: Path, args: str, busy: int) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text(FAKE_APT)
    fake.chmod(0o755)
    (tmp_path / "busy").write_text(str(busy))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(tmp_path)}
    script = (f'source "{REPO}/scripts/apt.sh"; SUDO=""; '
              f'exec 9>"{tmp_path}/own.lock"; apt_get {args}')
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)
    return done


def test_a_busy_apt_is_waited_for_and_the_install_goes_on(tmp_path):
    done = run_apt_get(tmp_path, "update -qq", busy=1)
    assert done.returncode == 0, done.stderr
    assert "apt is busy" in done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) == 2
    assert all("DPkg::Lock::Timeout=600" in call for call in calls)


def test_another_failure_is_reported_at_once(tmp_path):
    done = run_apt_get(tmp_path, "install -y no-such-package", busy=0)
    assert done.returncode == 1
    assert "Unable to locate package no-such-package" in done.stderr
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


def test_apt_does_not_inherit_the_install_scripts_lock(tmp_path):
    done = run_apt_get(tmp_path, "install -y tmux", busy=0)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "fd9").exists(), "apt-get (and what it starts) held the scripts' lock"
