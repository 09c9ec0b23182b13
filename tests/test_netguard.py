"""The network guard of `http_get`: loopback, private and metadata addresses are refused in
every spelling, at every redirect hop and for non-HTTP services; the connection goes to
the address that was checked (DNS rebinding) while TLS still verifies the name; the owner's
`[agent] http_allow` lets listed LAN hosts through; and a compressed body is cut at
`max_bytes` after decompression, so a gzip bomb cannot blow up the process. Real servers
on loopback throughout; a test-only name reaches one through an injected resolver."""

import asyncio
import os
import re
import socket
import struct
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from bot.app.config import ConfigError, build_config
from bot.tools import ToolContext
from bot.tools.builtin import http_get
from bot.tools.guarded_http import guarded_client
from bot.tools.netguard import NetGuard, Refused, parse_numeric_host, reason
from store import Writes
from tests.fakes.mail_tls import client_context, server_context


def resolver(table: dict[str, list[str]], calls: list[str] | None = None):
    """A resolver that knows only `table` (test-only names for local servers)."""
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append(host)
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[host]
    return resolve


def make_ctx(guard: NetGuard | None = None) -> ToolContext:
    ctx = ToolContext(store=None, task_id="T1", writes=Writes(),
                      http=httpx.AsyncClient(trust_env=False))
    if guard is not None:
        ctx.netguard = guard  # what the runtime builds from [agent] http_allow
    return ctx


async def fetch(url: str, guard: NetGuard | None = None, **arguments):
    ctx = make_ctx(guard)
    try:
        return await http_get.run(ctx, {"url": url, **arguments})
    finally:
        await ctx.http.aclose()


# --- the guard itself: every spelling of an inside address ------------------------------------

LOOPBACK_SPELLINGS = [
    "127.0.0.1", "localhost", "LOCALHOST.", "app.localhost", "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]", "2130706433", "0x7f000001", "0x7f.1", "0177.0.0.1", "127.1",
    "127.000.000.001", "127.254.1.9", "[::1]", "[::127.0.0.1]", "[64:ff9b::7f00:1]",
    "[2002:7f00:1::]",
]

REFUSED = [
    ("0.0.0.0", "unspecified"), ("0", "unspecified"), ("[::]", "unspecified"),
    ("10.1.2.3", "private"), ("172.16.0.1", "private"), ("172.31.255.254", "private"),
    ("192.168.1.10", "private"), ("3232235786", "private"), ("[::ffff:10.0.0.1]", "private"),
    ("[fc00::1]", "private"), ("[fd12:3456::1]", "private"),
    ("169.254.1.1", "link-local"), ("[fe80::1]", "link-local"),
    ("100.64.0.1", "CGNAT"), ("100.127.255.254", "CGNAT"),
    ("224.0.0.1", "multicast"), ("239.255.255.250", "multicast"), ("[ff02::1]", "multicast"),
    ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"), ("192.0.2.1", "reserved"),
    ("198.18.0.1", "reserved"), ("[2001:db8::1]", "reserved"), ("[fec0::1]", "reserved"),
    ("169.254.169.254", "metadata"), ("0xa9fea9fe", "metadata"), ("[fd00:ec2::254]", "metadata"),
    ("[::ffff:169.254.169.254]", "metadata"), ("100.100.100.200", "metadata"),
]


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
async def test_every_spelling_of_loopback_is_refused(host):
    with pytest.raises(Refused, match="loopback address"):
        await NetGuard(resolver=resolver({})).addresses(host, 80)


@pytest.mark.parametrize(("host", "why"), REFUSED)
async def test_inside_addresses_are_refused(host, why):
    with pytest.raises(Refused, match=why):
        await NetGuard(resolver=resolver({})).addresses(host, 80)


async def test_public_addresses_pass_and_names_are_judged_by_what_they_resolve_to():
    guard = NetGuard(resolver=resolver({"example.org": ["93.184.215.14", "2606:2800::1"],
                                        "sneaky.example": ["93.184.215.14", "10.0.0.7"],
                                        "mapped.example": ["::ffff:127.0.0.1"]}))
    assert await guard.addresses("8.8.8.8", 80) == ["8.8.8.8"]
    assert await guard.addresses("[::ffff:8.8.8.8]", 80) == ["8.8.8.8"]
    assert await guard.addresses("134744072", 80) == ["8.8.8.8"]
    assert await guard.addresses("[2606:4700:4700::1111]", 443) == ["2606:4700:4700::1111"]
    assert await guard.addresses("example.org", 443) == ["93.184.215.14", "2606:2800::1"]
    # one inside address among the answers refuses the name: no picking the safe one
    with pytest.raises(Refused) as refused:
        await guard.addresses("sneaky.example", 80)
    assert str(refused.value) == "sneaky.example resolves to 10.0.0.7, a private address"
    with pytest.raises(Refused, match="resolves to ::ffff:7f00:1, a loopback address"):
        await guard.addresses("mapped.example", 80)
    with pytest.raises(OSError):
        await guard.addresses("nowhere.example", 80)


async def test_messages_are_short_and_name_the_address():
    guard = NetGuard(resolver=resolver({}))
    for host, message in [
            ("127.0.0.1", "127.0.0.1 is a loopback address"),
            ("2130706433", "2130706433 (127.0.0.1) is a loopback address"),
            ("[::ffff:127.0.0.1]", "[::ffff:127.0.0.1] (127.0.0.1) is a loopback address"),
            ("localhost", "localhost resolves to 127.0.0.1, a loopback address"),
            ("169.254.169.254", "169.254.169.254 is a cloud metadata address")]:
        with pytest.raises(Refused) as refused:
            await guard.addresses(host, 80)
        assert str(refused.value) == message


def test_numeric_hosts_are_read_like_the_c_resolver_reads_them():
    assert str(parse_numeric_host("127.1")) == "127.0.0.1"
    assert str(parse_numeric_host("0x7f000001")) == "127.0.0.1"
    assert str(parse_numeric_host("017700000001")) == "127.0.0.1"
    assert str(parse_numeric_host("[::1]")) == "::1"
    for name in ("cafe.be", "example.org", "1e100.net", "127.0.0.1.nip.io"):
        assert parse_numeric_host(name) is None
    assert reason(parse_numeric_host("1.1.1.1")) is None


async def test_the_allowlist_lets_listed_lan_hosts_through():
    guard = NetGuard(["192.168.1.10", "nas.local", "10.0.0.0/24", "fd00:1::/64"],
                     resolver=resolver({"nas.local": ["192.168.1.20"],
                                        "printer.local": ["192.168.1.30"]}))
    assert await guard.addresses("192.168.1.10", 80) == ["192.168.1.10"]
    assert await guard.addresses("nas.local", 5000) == ["192.168.1.20"]
    assert await guard.addresses("NAS.local.", 5000) == ["192.168.1.20"]
    assert await guard.addresses("10.0.0.200", 80) == ["10.0.0.200"]
    assert await guard.addresses("[::ffff:10.0.0.9]", 80) == ["10.0.0.9"]
    assert await guard.addresses("[fd00:1::5]", 80) == ["fd00:1::5"]
    for host in ("192.168.1.11", "10.0.1.1", "printer.local", "127.0.0.1", "[fd00:2::5]"):
        with pytest.raises(Refused):
            await guard.addresses(host, 80)


async def test_metadata_passes_only_by_its_own_exact_entry():
    wide = NetGuard(["169.254.0.0/16", "meta.internal"],
                    resolver=resolver({"meta.internal": ["169.254.169.254"]}))
    assert await wide.addresses("169.254.10.10", 80) == ["169.254.10.10"]
    for host in ("169.254.169.254", "meta.internal"):
        with pytest.raises(Refused, match="cloud metadata"):
            await wide.addresses(host, 80)
    exact = NetGuard(["169.254.169.254"])
    assert await exact.addresses("169.254.169.254", 80) == ["169.254.169.254"]


def test_bad_allowlist_entries_fail_at_start_naming_the_key(tmp_path):
    for entry in ("10.0.0.0/33", "not a host", "", "http://nas.local", "10/8"):
        with pytest.raises(ValueError):
            NetGuard([entry])
    with pytest.raises(ValueError, match="'http://nas.local' is neither an address, a "
                                         "network nor a host name"):
        NetGuard(["http://nas.local"])
    config = build_config({"agent": {"http_allow": ["192.168.1.10", "nas.local",
                                                    "10.0.0.0/24"]}}, home=tmp_path)
    assert config.agent.http_allow == ["192.168.1.10", "nas.local", "10.0.0.0/24"]
    assert build_config({}, home=tmp_path).agent.http_allow == []
    with pytest.raises(ConfigError) as bad:
        build_config({"agent": {"http_allow": ["10.0.0.0/33"]}}, home=tmp_path)
    assert str(bad.value) == ("(no config file): [agent] http_allow: '10.0.0.0/33' is not a "
                              "network (e.g. 10.0.0.0/24)")


# --- http_get against real local servers -------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        server = self.server
        server.hits.append((self.path, self.headers.get("Host")))
        if self.path.startswith("/to?"):
            self._send(302, headers={"Location": self.path[4:]})
        elif self.path == "/gzip":
            body = zlib.compress(b"hello, " * 1000, wbits=31)
            self._send(200, body, {"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        elif self.path == "/deflate":
            self._send(200, zlib.compress(b"zlib-wrapped deflate"),
                       {"Content-Encoding": "deflate", "Content-Type": "text/plain"})
        elif self.path == "/raw-deflate":
            packer = zlib.compressobj(wbits=-15)
            body = packer.compress(b"raw deflate") + packer.flush()
            self._send(200, body, {"Content-Encoding": "deflate", "Content-Type": "text/plain"})
        elif self.path == "/two-members":
            body = zlib.compress(b"first ", wbits=31) + zlib.compress(b"second", wbits=31)
            self._send(200, body, {"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        elif self.path == "/brotli":
            self._send(200, b"\x0b\x02\x80hi\x03", {"Content-Encoding": "br"})
        elif self.path == "/bomb":
            bomb = server.bomb
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(bomb)))
            self.end_headers()
            try:
                for start in range(0, len(bomb), 64 * 1024):
                    self.wfile.write(bomb[start:start + 64 * 1024])
            except OSError:
                pass  # the client hung up
        else:
            self._send(200, f"you reached {self.path}".encode(),
                       {"Content-Type": "text/plain"})


def serve(host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    server.hits = []
    server.bomb = b""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def web():
    server = serve()
    try:
        yield server, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


# (dotted octal such as 0177.0.0.1 httpx itself refuses as an invalid URL)
@pytest.mark.parametrize("host", [
    "127.0.0.1", "localhost", "[::ffff:127.0.0.1]", "2130706433", "0x7f000001", "127.1",
    "0.0.0.0", "0x7f.1", "LOCALHOST.", "[::1]"])
async def test_http_get_refuses_loopback_in_every_spelling(web, host):
    server, port = web
    result = await fetch(f"http://{host}:{port}/secret")
    assert result.is_error, result.content
    assert re.fullmatch(r"error: Refused: .*(loopback|unspecified) address", result.content), \
        result.content
    assert server.hits == []  # nothing reached the server


async def test_http_get_refuses_metadata_and_private_before_connecting():
    for url, message in [
            ("http://169.254.169.254/latest/meta-data/",
             "169.254.169.254 is a cloud metadata address"),
            ("http://[fd00:ec2::254]/latest/meta-data/",
             "fd00:ec2::254 is a cloud metadata address"),
            ("https://10.0.0.1/", "10.0.0.1 is a private address")]:
        started = time.monotonic()
        result = await fetch(url)
        assert result.content == f"error: Refused: {message}"
        assert time.monotonic() - started < 1  # no connection attempt, no timeout


async def test_a_redirect_to_loopback_is_refused_at_the_redirect(web):
    server, port = web
    guard = NetGuard(["origin.test"], resolver=resolver({"origin.test": ["127.0.0.1"],
                                                         "inside.test": ["127.0.0.1"]}))
    start = f"http://origin.test:{port}/to?"
    ok = await fetch(f"{start}http://origin.test:{port}/page", guard)
    assert not ok.is_error, ok.content
    assert f"url: http://origin.test:{port}/page" in ok.content
    assert ok.content.endswith("you reached /page")
    assert server.hits[-1] == ("/page", f"origin.test:{port}")  # the Host header is the name

    for target, message in [
            (f"http://127.0.0.1:{port}/secret", "127.0.0.1 is a loopback address"),
            (f"http://localhost:{port}/secret",
             "localhost resolves to 127.0.0.1, a loopback address"),
            (f"http://[::ffff:127.0.0.1]:{port}/secret",
             "::ffff:127.0.0.1 (127.0.0.1) is a loopback address"),
            (f"http://inside.test:{port}/secret",
             "inside.test resolves to 127.0.0.1, a loopback address"),
            ("http://169.254.169.254/latest/meta-data/",
             "169.254.169.254 is a cloud metadata address")]:
        result = await fetch(start + target, guard)
        assert result.content == f"error: Refused: {message}"
    assert [path for path, _ in server.hits if path == "/secret"] == []


async def test_the_connection_goes_to_the_address_that_was_checked(web):
    """DNS rebinding: the name is resolved once per connection, by the guard; a second
    answer (here: loopback) is never asked for, let alone used."""
    inside, port = web  # 127.0.0.1: must never be reached
    outside = serve("127.0.0.2", port)  # stands for the public address that was checked
    try:
        calls: list[str] = []
        answers = iter([["127.0.0.2"], ["127.0.0.1"], ["127.0.0.1"]])

        async def rebinding(host: str, port: int) -> list[str]:
            calls.append(host)
            return next(answers)

        guard = NetGuard(["127.0.0.2"], resolver=rebinding)
        result = await fetch(f"http://rebind.test:{port}/page", guard)
        assert not result.is_error, result.content
        assert result.content.endswith("you reached /page")
        assert calls == ["rebind.test"]
        assert outside.hits == [("/page", f"rebind.test:{port}")]
        assert inside.hits == []
        # a later fetch gets the rebound answer, and it is refused
        again = await fetch(f"http://rebind.test:{port}/page", guard)
        assert again.content == ("error: Refused: rebind.test resolves to 127.0.0.1, "
                                 "a loopback address")
        assert inside.hits == []
    finally:
        outside.shutdown()
        outside.server_close()


async def test_tls_verifies_the_name_not_the_pinned_address():
    """The certificate is valid for localhost and 127.0.0.1, not for other.test: reached
    at 127.0.0.1 under that name, the check must fail (it would pass for the address)."""
    names: list[str | None] = []
    context = server_context()
    context.sni_callback = lambda sock, name, ctx: names.append(name)

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    guard = NetGuard(["localhost", "other.test"],
                     resolver=resolver({"other.test": ["127.0.0.1"]}))
    try:
        async with guarded_client(guard, ssl_context=client_context()) as http:
            response = await http.get(f"https://localhost:{port}/")
            assert (response.status_code, response.text) == (200, "ok")
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await http.get(f"https://other.test:{port}/")
        assert names == ["localhost", "other.test"]  # SNI carries the name
    finally:
        server.close()
        await server.wait_closed()


async def test_a_raw_tcp_service_on_loopback_is_refused_untouched():
    connections: list[bytes] = []

    async def handle(reader, writer):
        writer.write(b"+OK redis-ish banner\r\n")
        await writer.drain()
        try:
            connections.append(await asyncio.wait_for(reader.read(1000), 2))
        except TimeoutError:
            connections.append(b"")
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await fetch(f"http://127.0.0.1:{port}/")
        assert result.content == "error: Refused: 127.0.0.1 is a loopback address"
        await asyncio.sleep(0.1)
        assert connections == []  # not even a connection, let alone a request
    finally:
        server.close()
        await server.wait_closed()


async def test_compressed_bodies_are_decoded(web):
    _, port = web
    guard = NetGuard(["127.0.0.1"])
    base = f"http://127.0.0.1:{port}"
    gz = await fetch(f"{base}/gzip", guard)
    assert gz.content.endswith("\n\n" + "hello, " * 1000)
    cut = await fetch(f"{base}/gzip", guard, max_bytes=12)
    assert cut.content.endswith("hello, hello\n\n[truncated: only the first 12 bytes of the "
                                "body were read]")
    for path, text in [("/deflate", "zlib-wrapped deflate"), ("/raw-deflate", "raw deflate"),
                       ("/two-members", "first second")]:
        result = await fetch(base + path, guard)
        assert result.content.endswith("\n\n" + text), (path, result.content)
    brotli = await fetch(f"{base}/brotli", guard)
    assert brotli.content == "error: ValueError: cannot decode content-encoding 'br'"


# --- a gzip bomb ---------------------------------------------------------------------------------

GIB = 1 << 30


def gzip_bomb(size: int = GIB) -> bytes:
    """~1 MB of gzip that inflates to `size` zero bytes, made in well under a second: after
    a full flush the compressor starts afresh, so one compressed MiB can be repeated."""
    mib = bytes(1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = packer.compress(mib) + packer.flush(zlib.Z_FULL_FLUSH)
    again = packer.compress(mib) + packer.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(mib, crc)
    # an empty final block, then the gzip trailer (CRC-32 and size mod 2**32)
    return first + again * ((size >> 20) - 1) + b"\x03\x00" + struct.pack(
        "<II", crc, size & 0xFFFF_FFFF)


def test_the_bomb_is_a_real_one():
    small = gzip_bomb(8 << 20)
    assert zlib.decompress(small, wbits=31) == bytes(8 << 20)
    assert len(gzip_bomb()) < 1_100_000


class PeakRSS:
    """Peak resident memory while the block runs: the kernel's high-water mark (reset on
    entry through /proc/self/clear_refs) and, where that cannot be reset, /proc/self/statm
    sampled every millisecond."""

    def __enter__(self):
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.start = self._rss()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.hwm = True
        except OSError:
            self.hwm = False
        self.peak = self.start
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._sampler.join()
        if self.hwm:
            with open("/proc/self/status") as f:
                high = int(re.search(r"VmHWM:\s+(\d+) kB", f.read())[1]) * 1024
            self.peak = max(self.peak, high)
        self.growth = self.peak - self.start

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self._rss())


async def test_a_gzip_bomb_is_cut_at_max_bytes_without_inflating(web):
    server, port = web
    server.bomb = gzip_bomb()  # 1 MB that inflates to 1 GiB
    guard = NetGuard(["127.0.0.1"])
    await fetch(f"http://127.0.0.1:{port}/gzip", guard)  # warm up: imports, SSL context
    with PeakRSS() as rss:
        started = time.monotonic()
        result = await fetch(f"http://127.0.0.1:{port}/bomb", guard, max_bytes=1_000_000)
        elapsed = time.monotonic() - started
    assert not result.is_error, result.content[:300]
    # the tool read exactly max_bytes of inflated body (the result itself is cut at 50,000)
    more = int(re.search(r"\[truncated: ([\d,]+) more characters\]$",
                         result.content)[1].replace(",", ""))
    full = result.content[:50_000].split("\n\n", 1)[0] + "\n\n" + "\0" * 1_000_000 + (
        "\n\n[truncated: only the first 1,000,000 bytes of the body were read]")
    assert more == len(full) - 50_000
    print(f"gzip bomb: peak RSS growth {rss.growth / 1e6:.1f} MB in {elapsed:.2f} s")
    assert rss.growth < 30_000_000
    assert elapsed < 5
