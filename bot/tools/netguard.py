"""May a fetch reach that address? The network guard of the tools that reach the web.

A URL given to a tool is data from outside (a page, a mail, the model), so it may point
back inside: at this machine (`127.0.0.1`, `localhost`, `[::ffff:127.0.0.1]`, `2130706433`,
`0x7f000001`, `127.1`, `0.0.0.0`), at the LAN, or at a cloud's metadata service. The guard
answers for one host and port with the addresses a connection may use, after resolving a
name (off the event loop) and checking every address it resolves to; a host that is, or
resolves to, anything but a public address is refused (`Refused`), unless the owner listed
it in `[agent] http_allow`:

- an address (`192.168.1.10`) or network (`10.0.0.0/24`): addresses inside it pass;
- a host name (`nas.local`): whatever that name resolves to passes.

Cloud metadata addresses pass only when listed exactly, never through a network or a name.
Numeric hosts are read the way the C resolver reads them (`inet_aton`: decimal, hex, octal
and short forms), and IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64,
6to4) are judged by that address. The check is only as good as the connection that follows
it: `bot.tools.guarded_http` connects to exactly the addresses returned here, so a name
that resolves differently a moment later (DNS rebinding) changes nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

__all__ = ["NetGuard", "Refused", "Resolver", "parse_allow", "parse_numeric_host", "reason"]

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network
# (host, port) -> the addresses it resolves to, as strings
Resolver = Callable[[str, int], Awaitable[Iterable[str]]]


class Refused(ValueError):
    """A fetch would reach an address it may not; `str()` says which and why."""


METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, ...
    "169.254.170.2",  # AWS ECS task metadata
    "fd00:ec2::254",  # AWS over IPv6
    "100.100.100.200",  # Alibaba Cloud
))

_UNSPECIFIED = "an unspecified address"
_LOOPBACK = "a loopback address"
_PRIVATE = "a private address"
_LINK_LOCAL = "a link-local address"
_MULTICAST = "a multicast address"
_RESERVED = "a reserved address"

_RANGES: list[tuple[IPNetwork, str]] = [(ipaddress.ip_network(net), why) for net, why in (
    ("0.0.0.0/8", _UNSPECIFIED),  # "this network"; connecting to 0.0.0.0 reaches this host
    ("127.0.0.0/8", _LOOPBACK),
    ("10.0.0.0/8", _PRIVATE),
    ("172.16.0.0/12", _PRIVATE),
    ("192.168.0.0/16", _PRIVATE),
    ("100.64.0.0/10", "a shared (CGNAT) address"),
    ("169.254.0.0/16", _LINK_LOCAL),
    ("224.0.0.0/4", _MULTICAST),
    ("240.0.0.0/4", _RESERVED),  # and the broadcast address 255.255.255.255
    ("192.0.0.0/24", _RESERVED),  # IETF protocol assignments
    ("192.0.2.0/24", _RESERVED),  # documentation (TEST-NET-1..3)
    ("198.51.100.0/24", _RESERVED),
    ("203.0.113.0/24", _RESERVED),
    ("198.18.0.0/15", _RESERVED),  # benchmarking
    ("192.88.99.0/24", _RESERVED),  # the retired 6to4 relay anycast
    ("::/128", _UNSPECIFIED),
    ("::1/128", _LOOPBACK),
    ("fe80::/10", _LINK_LOCAL),
    ("fc00::/7", "a private (unique local) address"),
    ("ff00::/8", _MULTICAST),
    ("fec0::/10", _RESERVED),  # the retired site-local range
    ("100::/64", _RESERVED),  # discard
    ("2001::/32", _RESERVED),  # Teredo tunnels
    ("2001:db8::/32", _RESERVED),  # documentation
)]
_GLOBAL_UNICAST = IPv6Network("2000::/3")
_V4_COMPATIBLE = IPv6Network("::/96")
_NAT64 = (IPv6Network("64:ff9b::/96"), IPv6Network("64:ff9b:1::/48"))
_INET_ATON = re.compile(r"[0-9a-fA-FxX.]+")  # what the C resolver may read as a number
_LOCALHOST = (IPv4Address("127.0.0.1"), IPv6Address("::1"))
_HOST_NAME = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\.?")
_NO_BRACKETS = str.maketrans("", "", "[]")


def embedded_ipv4(ip: IPAddress) -> IPv4Address | None:
    """The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64, 6to4)."""
    if not isinstance(ip, IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _V4_COMPATIBLE or any(ip in net for net in _NAT64):
        low = IPv4Address(int(ip) & 0xFFFF_FFFF)
        # :: and ::1 are IPv6's own unspecified and loopback addresses, judged as such
        return None if ip in _V4_COMPATIBLE and int(ip) <= 1 else low
    return None


def reason(ip: IPAddress) -> str | None:
    """Why a connection may not reach `ip` ("a loopback address"), or None if it is a
    public address."""
    if ip in METADATA:
        return "a cloud metadata address"
    inner = embedded_ipv4(ip)
    if inner is not None:
        return reason(inner)
    for net, why in _RANGES:
        if ip.version == net.version and ip in net:
            return why
    if isinstance(ip, IPv6Address) and ip not in _GLOBAL_UNICAST:
        return _RESERVED
    return None if ip.is_global else "not a public address"


def parse_numeric_host(host: str) -> IPAddress | None:
    """The address a numeric host spells, in any spelling the C resolver accepts
    (`127.1`, `2130706433`, `0x7f000001`, `0177.0.0.1`, `[::ffff:127.0.0.1]`), else None
    (a name)."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _INET_ATON.fullmatch(text):
        try:
            return IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def _normal(ip: IPAddress) -> IPAddress:
    """IPv4-mapped IPv6 compared as the IPv4 address it is; no scope id."""
    if isinstance(ip, IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.scope_id:
            return IPv6Address(str(ip).split("%", 1)[0])
    return ip


def _connectable(ip: IPAddress) -> str:
    """The address to connect to: an IPv4-mapped one as IPv4, a scope id kept."""
    mapped = ip.ipv4_mapped if isinstance(ip, IPv6Address) else None
    return str(mapped or ip)


def _name(host: str) -> str:
    return host.strip().lower().rstrip(".")


def parse_allow(entries: Iterable[str]) -> tuple[list[IPNetwork], frozenset[str]]:
    """`[agent] http_allow` as (networks, host names); ValueError names a bad entry."""
    networks: list[IPNetwork] = []
    names: set[str] = set()
    for entry in entries:
        text = entry.strip()
        if not text:
            raise ValueError("an empty entry")
        address, slash, _ = text.partition("/")
        if slash and parse_numeric_host(address) is not None:
            try:
                networks.append(ipaddress.ip_network(text.translate(_NO_BRACKETS),
                                                     strict=False))
            except ValueError:
                raise ValueError(f"{entry!r} is not a network (e.g. 10.0.0.0/24)") from None
            continue
        ip = parse_numeric_host(text)
        if ip is not None:
            networks.append(ipaddress.ip_network(_normal(ip)))
        elif _HOST_NAME.fullmatch(text):
            names.add(_name(text))
        else:
            raise ValueError(f"{entry!r} is neither an address, a network nor a host name "
                             "(e.g. 192.168.1.10, 10.0.0.0/24, nas.local)")
    return networks, frozenset(names)


async def system_resolver(host: str, port: int) -> list[str]:
    """The system's resolver (getaddrinfo), in the loop's thread pool."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


class NetGuard:
    """Which addresses a fetch may reach: public ones, and what the owner allowed.

    `allow` is `[agent] http_allow`; `resolver` turns a name into addresses (the system's
    by default; tests pass their own, so a test-only name can stand for a local server).
    """

    def __init__(self, allow: Iterable[str] = (), *, resolver: Resolver | None = None):
        self._networks, self._names = parse_allow(allow)
        self._resolve = resolver or system_resolver

    def __repr__(self) -> str:
        listed = [str(n) for n in self._networks] + sorted(self._names)
        return f"NetGuard(allow={listed!r})"

    async def addresses(self, host: str, port: int) -> list[str]:
        """The addresses a connection to `host` may use, every one of them checked; raises
        `Refused` if any address it resolves to may not be reached, and OSError if the
        name does not resolve."""
        numeric = parse_numeric_host(host)
        if numeric is not None:
            self._check(numeric, host, named=False)
            return [_connectable(numeric)]
        name = _name(host)
        if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: always loopback
            found = list(_LOCALHOST)
        else:
            found = [ipaddress.ip_address(a) for a in await self._resolve(name, port)]
        if not found:
            raise OSError(f"{host} resolves to no address")
        for ip in found:
            self._check(ip, host, named=True)
        return list(dict.fromkeys(_connectable(ip) for ip in found))

    def _check(self, ip: IPAddress, host: str, *, named: bool) -> None:
        why = reason(ip)
        if why is None or self._allowed(ip, named=named and _name(host) in self._names):
            return
        if named:
            raise Refused(f"{host} resolves to {ip}, {why}")
        shown = host if str(ip) == host.strip("[]") else f"{host} ({_normal(ip)})"
        raise Refused(f"{shown} is {why}")

    def _allowed(self, ip: IPAddress, *, named: bool) -> bool:
        ip = _normal(ip)
        if ip in METADATA:  # only ever by its own exact entry
            return any(net.num_addresses == 1 and ip in net for net in self._networks
                       if net.version == ip.version)
        return named or any(ip in net for net in self._networks if net.version == ip.version)
