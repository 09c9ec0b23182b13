"""The service manager's side of `steward run`: systemd's notify protocol (sd_notify(3)).

Under `Type=notify` the unit counts Steward as started when it says `READY=1`, and with
`WatchdogSec=` it restarts a Steward that stops saying `WATCHDOG=1`. The pings come from
the runner's own claim loop (`Notifier.beat`, through `bot/runtime/supervision.py`), not
from a timer beside it: a loop that is gone or stuck goes quiet, and systemd starts a
fresh process. Outside systemd (`$NOTIFY_SOCKET` unset) every call does nothing.
"""

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, env=os.environ):
        address = env.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # an abstract socket
            address = "\0" + address[1:]
        self._address = address or None
        usec = env.get("WATCHDOG_USEC", "")
        mine = env.get("WATCHDOG_PID", str(os.getpid())) == str(os.getpid())
        # Ping four times per period: a slow turn of the loop is not a dead one.
        self._every = int(usec) / 4e6 if usec.isdigit() and mine else None
        self._last = 0.0
        self._sock: socket.socket | None = None

    @property
    def active(self) -> bool:
        return self._address is not None

    def send(self, message: str) -> None:
        if self._address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.setblocking(False)  # a datagram to a local socket: never waits
            self._sock.sendto(message.encode(), self._address)
        except OSError as exc:
            log.debug("sd_notify %r: %s", message, exc)

    def ready(self) -> None:
        self.send("READY=1\nSTATUS=serving")

    def status(self, text: str) -> None:
        self.send(f"STATUS={text}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def beat(self) -> None:
        """The watchdog's ping, at most four times per period."""
        if self._every is None:
            return
        now = time.monotonic()
        if now - self._last >= self._every:
            self._last = now
            self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
