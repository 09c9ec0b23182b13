"""The fake Slack and the SMTP sink for the chaos test (tests/test_chaos.py), each with a
hook that sees what it was just given, synchronously, before the client hears the answer:
so a test can kill the client exactly there ("the message is posted, Steward never heard
back"; "the Sent copy is appended, DATA never came").

`ChaosSlack.on_call(method, params, result)`: after a Web API call took effect, on the fake
Slack's server thread, before the answer is written back.

`ChaosSink.on_smtp(stage)`: "rcpt" (the envelope is accepted; the reply is not journaled in
Sent yet), "noop" (Steward's NOOP between its Sent copy and DATA: the copy is in Sent,
nothing was sent), "data" (the message is captured), each before the sink answers.
`ChaosSink.cut_off`: the bytes of each DATA whose connection went away before the final dot
(the server drops such a message: the one window a sender cannot know the outcome of).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiosmtpd.smtp import SMTP

from tests.fakes.mail_servers import SmtpSink
from tests.fakes.slack_server import FakeSlack


class _WatchedSMTP(SMTP):
    """Keeps what a DATA exchange received, to tell the sink when it ends before the dot."""

    async def smtp_DATA(self, arg: str) -> None:  # noqa: N802 - aiosmtpd's name
        reader = self._reader
        readuntil = reader.readuntil
        received = bytearray()

        async def reading(separator: bytes = b"\n") -> bytes:
            line = await readuntil(separator)
            received.extend(line)
            return line

        reader.readuntil = reading
        try:
            await super().smtp_DATA(arg)
        except asyncio.CancelledError:  # the connection closed inside DATA
            self.event_handler.cut_off.append(bytes(received))
            raise
        finally:
            reader.readuntil = readuntil


class ChaosSlack(FakeSlack):
    def __init__(self) -> None:
        super().__init__()
        self.on_call: Callable[[str, dict, dict], None] | None = None

    def _call(self, method: str, params: dict, token: str) -> dict:
        result = super()._call(method, params, token)
        hook = self.on_call
        if hook is not None:
            hook(method, params, result)
        return result


class ChaosSink(SmtpSink):
    server_class = _WatchedSMTP

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.on_smtp: Callable[[str], None] | None = None
        self.stages: list[str] = []
        self.cut_off: list[bytes] = []

    def _note(self, stage: str) -> None:
        self.stages.append(stage)
        if self.on_smtp is not None:
            self.on_smtp(stage)

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options  # noqa: N802
                          ) -> str:
        envelope.rcpt_tos.append(address)
        self._note("rcpt")
        return "250 OK"

    async def handle_NOOP(self, server, session, envelope, arg) -> str:  # noqa: N802
        self._note("noop")
        return "250 OK"

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 - aiosmtpd
        answer = await super().handle_DATA(server, session, envelope)
        self._note("data")
        return answer
