"""The channel seam: `Channel`'s optional capabilities default to "cannot" and the core goes
by them, never by a channel's name; the real port has every method of the `AgentPort`
Protocol connectors are typed against; `open_app` takes its parts (a store, a model
client, a connector of the test's own) and runs on them."""

import asyncio
import inspect

import httpx
import pytest

from bot.agent.inbox import submit_message
from bot.agent_port import LocalPort
from bot.app.config import build_config
from bot.app.wiring import open_app, wire
from bot.channels import Channel, Connector, Outbound, typed_approval
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response
from bot.port import AgentPort, Host
from bot.runtime import RunnerOptions
from bot.scheduler.tool import schedule as schedule_tool
from bot.tools import ToolBox, ToolContext
from bot.tools.permissions import recipients
from connectors.email.channel import EmailChannel
from connectors.email.config import EmailConfig
from connectors.slack.outbound import SlackChannel
from connectors.terminal import TerminalChannel
from store import new_id

OPTIONS = RunnerOptions(concurrency=2, lease_seconds=5, retry_base_seconds=0.01,
                        retry_max_seconds=0.02, poll_seconds=0.02)


class Board(Channel):
    """A channel of the test's own: keeps what it is sent."""

    name = "board"

    def __init__(self):
        self.shown: list[Outbound] = []

    async def send(self, message: Outbound) -> dict:
        self.shown.append(message)
        return {"posted": len(self.shown)}


class Wall(Connector):
    """A connector of the test's own, built from the host it is handed."""

    name = "board"

    def __init__(self, host: Host):
        self.host = host
        self.channel = Board()
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False


def outbound(**reply_to) -> Outbound:
    return Outbound(key="k", conversation_key="x:1", conversation_id=1, text="hi",
                    reply_to=reply_to)


async def test_what_a_channel_does_not_declare_it_cannot_do():
    board = Board()
    assert await board.find(outbound()) is None
    assert await board.retract(outbound()) == {}
    assert board.withdrawal_ref({"message_ts": "1.2", "channel": "C"}) is None
    assert board.address_of("ann@example.com", subject="s") is None
    assert board.direct_to({"user": "U1"}) is None
    assert board.asker_address("ann@example.com") is None
    assert (board.circle, board.shows_progress, board.reaches_addresses) == ((), False, False)
    assert board.how_to_approve("abc123") == typed_approval("abc123")
    with pytest.raises(TypeError):
        Channel()  # `send` is the one thing every channel must do


def test_the_channels_declare_what_they_can_do():
    email = EmailChannel(EmailConfig(enabled=True, address="s@example.org", imap_host="i",
                                     smtp_host="s", allowed_senders=["@example.org"]),
                         open_session=None, smtp_password=None, sender_name="Steward")
    slack = SlackChannel(None, None, None)  # type: ignore[arg-type]  # no server: not asked
    terminal = TerminalChannel(None)  # type: ignore[arg-type]
    assert email.reaches_addresses and not slack.reaches_addresses
    assert email.address_of("b@x.org", subject="digest") == {"to": "b@x.org",
                                                               "subject": "digest"}
    assert email.asker_address("b@x.org") == "b@x.org" and slack.asker_address("U1") is None
    assert email.circle == ("@example.org",) and slack.circle == ()
    assert slack.direct_to({"user": "U1", "team": "T"})["channel"] == "U1"
    assert slack.withdrawal_ref({"channel": "C1", "message_ts": "1.5"}) is not None
    assert slack.shows_progress and not email.shows_progress
    hows = {c.how_to_approve("c0de42") for c in (email, slack, terminal)}
    assert len(hows) == 3 and all("c0de42" in h for h in hows)


def test_the_real_port_has_what_connectors_are_typed_against():
    members = {n for n in vars(AgentPort) if not n.startswith("_")}
    assert {"submit", "keep", "journal_put", "events", "shared"} <= members
    for name in members:
        declared, real = getattr(AgentPort, name), getattr(LocalPort, name, None)
        assert real is not None, f"LocalPort lacks {name}"
        if isinstance(declared, property):
            assert isinstance(real, property), name
            continue
        assert inspect.signature(real) == inspect.signature(declared), name
        assert inspect.iscoroutinefunction(real) == inspect.iscoroutinefunction(declared), name
    # What only the agent's side uses stays off the seam.
    assert not hasattr(AgentPort, "wake") and not hasattr(AgentPort, "kill_point")


async def test_open_app_runs_on_the_parts_it_is_handed(store, tmp_path):
    config = build_config({}, home=tmp_path)
    model = ScriptedModel(lambda request: Response(text="noted"))
    walls: list[Wall] = []

    def wall(host: Host) -> Wall:
        walls.append(Wall(host))
        return walls[-1]

    async with open_app(config, store=store, client=model, connectors=[wall],
                        options=OPTIONS) as app:
        assert app.store is store and app.deps.client is model
        [built] = app.connectors
        assert built is walls[0] and app.deps.channels["board"] is built.channel
        assert built.host.home == tmp_path and isinstance(built.host.port, LocalPort)
        await submit_message(store, channel="board", external_ids=["m1"],
                             conversation_key="board:1", text="remember the milk",
                             reply_to={"pin": 1})
        await asyncio.wait_for(app.runner.run(until_idle=True), 30)
        [shown] = built.channel.shown
        assert (shown.text, shown.reply_to) == ("noted", {"pin": 1})
    # The store handed in is the caller's: still open after the app closed.
    assert (await store.get_conversation("board:1")).key == "board:1"


class Post(Channel):
    """A channel by another name that can write to an address: the core goes by what it
    declares, never by which channel it is."""

    name = "post"
    reaches_addresses = True
    circle = ("@example.org",)

    async def send(self, message: Outbound) -> dict:
        return {}

    def address_of(self, address: str, *, subject: str) -> dict:
        return {"box": address, "about": subject}

    def asker_address(self, who: str | None) -> str | None:
        return who


async def test_mailing_goes_by_the_channels_capabilities_not_their_names(store, tmp_path):
    async with httpx.AsyncClient() as http:
        app = wire(build_config({}, home=tmp_path), store, ScriptedModel([]), http,
                   toolbox=ToolBox(schedule_tool), channels={"post": Post()})
        mailers = recipients(app.deps)
        assert mailers.mailers == {"post"}  # the terminal cannot mail anyone
        assert mailers.email_refusal("bo@example.org", asker=None) is None  # its circle
        conv = await store.ensure_conversation("post:ann@elsewhere.net",
                                               owner="ann@elsewhere.net")
        ctx = ToolContext(store=store, task_id=new_id(), conversation_id=conv.id, http=http,
                          timezone="UTC", origin={"channel": "post", "reply_to": {}},
                          recipients=mailers, channels=app.deps.channels)
        made = await schedule_tool.run(ctx, {"action": "create", "name": "digest",
                                             "prompt": "Mail me my to-dos.",
                                             "cron": "0 7 * * mon", "deliver_to": "email"})
        await store.commit(ctx.writes)
        assert made.content.startswith("Scheduled 'digest'"), made.content
        [s] = await store.list_schedules()
        # The asker's own address, from the channel that knows people by address.
        assert s.deliver == {"channel": "post",
                             "reply_to": {"box": "ann@elsewhere.net", "about": "digest"}}
        # Without a channel that reaches addresses, nothing is mailed.
        bare = wire(build_config({}, home=tmp_path), store, ScriptedModel([]), http,
                    toolbox=ToolBox())
        assert "not enabled" in recipients(bare.deps).email_refusal("bo@example.org",
                                                                    asker=None)
