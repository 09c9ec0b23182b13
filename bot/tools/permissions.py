"""Who Steward may send things to on a person's behalf: the one place that decides.

The model does what text tells it often enough, and text comes from outside (a mail body,
a fetched page, a quoted message), so a tool that sends anything outside never takes the
model's word for the recipient. It may send to:

- the person who asked, where the channel knows them (the sender of an email
  conversation; the Slack user who asked, for a Slack DM);
- the configured circle: `[agent] allowed_recipients`, and the addresses (or whole
  domains, "@example.com") listed in `[email] allowed_senders` — people the owner already
  lets talk to Steward;

and only through a channel that is enabled. Anything else needs the person's approval
(`bot/agent/approval.py`: a durable wait for their yes or no), asked before the call runs.

A fetch sends too: the address itself reaches its server ("https://evil.test/?pin=1234",
or the PIN as a host name). So a tool that reaches the NETWORK fetches, without asking,
only an address that stands whole in the person's own words in the messages this turn
answers (not a part of one, nor one from a forwarded, quoted or attached part:
`bot.provenance.own_words`), or one on a host listed in `[agent] fetch_hosts`; any other
address, a link found in a page included, needs their approval. Every address in a
network tool's arguments counts, nested ones too (an MCP call's).

Approval is also asked, whatever the arguments, for:

- the tools named in `[agent] approval_tools`, and unsafe tools from `[agent]
  tool_modules` and MCP servers (unless `approve_unsafe_custom_tools = false`);
- a tool that SENDS or changes SCHEDULES when the turn's request holds outside text
  (`bot/provenance.py`: a page, a search hit, an MCP answer, a forwarded, quoted or
  attached part, a recalled mail, or a fact, summary or reminder made from such text);
  so do changes to what Steward remembers (`bot.memory.facts`, the to-do list) and MCP
  tools the owner has not declared trusted (`bot.tools.mcp`). Such text is data, never
  permission, and an instruction hidden in it must not act unseen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from bot.provenance import urls_in, whole_urls

SENDS = "sends"  # puts something in front of someone (mail, a post)
SCHEDULES = "schedules"  # makes Steward act later, unattended
READS_OUTSIDE = "reads_outside"  # its result is text from outside (a page, old mail)
PRIVATE = "private_memory"  # reads what the person told Steward
REMEMBERS = "changes_memory"  # changes what Steward keeps for the person (facts, to-dos)
NETWORK = "network"  # reaches hosts on the network: its `url` argument leaves Steward


@dataclass(frozen=True)
class Recipients:
    """The configured circle and the channels that can mail an address (built per tool
    call)."""

    allowed: frozenset[str] = frozenset()  # addresses or "@domain", lower case
    # The enabled channels that can start a conversation with an address
    # (`Channel.reaches_addresses`): without one, nothing is mailed.
    mailers: frozenset[str] = frozenset()

    @classmethod
    def of(cls, entries: Iterable[str], mailers: Iterable[str]) -> Recipients:
        return cls(frozenset(e.strip().lower() for e in entries if e.strip()),
                   frozenset(mailers))

    def email_refusal(self, address: str, *, asker: str | None) -> str | None:
        """Why `address` may not be mailed for this asker (None: it may)."""
        if not self.mailers:
            return "email is not enabled here (the [email] section of the config)"
        address = address.strip().lower()
        if not _is_address(address):
            return f"{address!r} is not an email address"
        if asker and address == asker.strip().lower():
            return None
        if address in self.allowed or "@" + address.rpartition("@")[2] in self.allowed:
            return None
        return (f"{address} is not the person asking nor one of the configured recipients; "
                "Steward only sends to those unless the person approves (the owner can add "
                "it to [agent] allowed_recipients)")

    def may_approve_email(self, address: str) -> bool:
        """Whether the person's yes can make mail to `address` possible: only a real
        address through an enabled channel (a refusal for anything else stands)."""
        return bool(self.mailers) and _is_address(address.strip())


def _is_address(text: str) -> bool:
    parts = text.split("@")
    return len(parts) == 2 and all(parts)


@dataclass(frozen=True)
class Asking:
    """Who a tool call acts for, as the permission rules see it."""

    recipients: Recipients
    asker: str | None = None  # their address where the channel knows it (email)
    approved: bool = False  # the person already said yes to this very call
    read_outside: str | None = None  # the tool whose outside text this turn has read
    who: str = "local"  # whom an approval goes to: the person who asked
    own_words: str = ""  # what the person wrote in the messages this turn answers


def recipients(deps: Any) -> Recipients:
    """The circle from the config and the channels' own (email: its allowed senders), and
    the channels this process can mail an address through."""
    circle = list(deps.config.agent.allowed_recipients)
    for channel in deps.channels.values():
        circle += channel.circle
    return Recipients.of(circle, [name for name, channel in deps.channels.items()
                                  if channel.reaches_addresses])


def approval_needed(tool: Any, arguments: dict, asking: Asking, *, custom: bool,
                    config: Any) -> str | None:
    """The rules that need no look at the arguments (see the module docstring): what to
    ask the person, or None. The tool's own rule (`Tool.approval`) is asked separately."""
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(arguments.items()))[:300]
    if tool.name in config.agent.approval_tools or (
            custom and tool.policy_for(arguments) == "unsafe"
            and config.agent.approve_unsafe_custom_tools):
        return f"run the tool {tool.name} ({shown})"
    if NETWORK in tool.touches:
        for url in _addresses(arguments):
            if not _may_fetch(url, asking.own_words, config.agent.fetch_hosts):
                return (f"fetch {url[:200]} with {tool.name}: an address you did not write, "
                        "and the address itself reaches that server")
    if asking.read_outside and tool.touches & {SENDS, SCHEDULES}:
        return (f"run {tool.name} ({shown}), asked for after reading text from outside "
                f"(via {asking.read_outside}), which may be trying to make me do it")
    return None


def _addresses(arguments: dict) -> list[str]:
    """What a network tool's call would reach: its `url` as given, and every address
    anywhere else in its arguments (an MCP call nests them)."""
    url = arguments.get("url")
    given = [url.strip()] if isinstance(url, str) and url.strip() else []
    rest = urls_in({k: v for k, v in arguments.items() if k != "url"})
    return given + [u for u in rest if u not in given]


def _may_fetch(url: str, own_words: str, hosts: Iterable[str]) -> bool:
    """Whether `url` may be fetched unasked: it stands whole in the person's own words (not
    a part of one, not from a forwarded, quoted or attached part), or is on a listed host."""
    url = url.strip()
    if url and url in whole_urls(own_words):
        return True
    from urllib.parse import urlsplit

    try:
        host = (urlsplit(url).hostname or "").lower()
    except ValueError:
        return False
    return bool(host) and any(host == h or (h.startswith(".") and host.endswith(h))
                              for h in (x.strip().lower() for x in hosts))
