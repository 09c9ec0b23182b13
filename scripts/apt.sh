# Sourced by the install scripts: apt-get that waits for apt's locks instead of failing on
# them. On a fresh machine something else often holds them for minutes (unattended-upgrades
# after boot, or a second test run installing the same packages), and apt-get gives up at
# once: "Could not get lock /var/lib/dpkg/lock-frontend" or ".../lists/lock". Any other
# failure is reported as it is.
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive

apt_get() {
  local start=$SECONDS said="" err
  # DPkg::Lock::Timeout covers the dpkg locks; `apt-get update`'s lists lock has no
  # timeout option, so a lock error of any kind is retried here, until 10 minutes have
  # passed in all (time spent inside apt-get's own wait counts).
  # 9>&- : a service the package starts (PostgreSQL, Dovecot) must not inherit the install
  # scripts' own lock (install-test-deps) and hold it for as long as it runs.
  until err="$($SUDO apt-get -o DPkg::Lock::Timeout=600 "$@" 2>&1 >/dev/null 9>&-)"; do
    if [[ "$err" != *"Could not get lock"* && "$err" != *"Unable to lock"* ]] \
      || [ $((SECONDS - start)) -ge 600 ]; then
      printf '%s\n' "$err" >&2
      return 1
    fi
    [ -n "$said" ] || echo "apt is busy (another install is running): waiting for it" >&2
    said=1
    sleep 5
  done
}
