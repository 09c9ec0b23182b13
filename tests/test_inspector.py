"""The web inspector (`steward web`): real pages over a real history on SQLite and
PostgreSQL, read by plain HTTP and by headless Chromium through chromedriver, whose
screenshots are checked for real content.

One history, one server and one browser per backend and module: a Chromium start costs
about a second. Screenshots are kept in $STEWARD_SHOTS when set (else a temporary dir).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import shutil
import socket
import sys
import time
import uuid
from html import escape
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from aiohttp import web
from PIL import Image
from sqlalchemy import update

from bot.agent.context import assemble
from bot.app.config import load_config
from bot.app.inspector.chart import PALETTE
from bot.app.inspector.server import make_app
from bot.app.inspector.source import open_source
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, ToolCall, Usage
from store import ScheduleWrite, UsageRecord, Writes, open_store
from store.schema import usage
from tests.conftest import BACKENDS, PG_URL, _pg_admin
from tests.fakes.agent_rig import rig_factory

pytestmark = pytest.mark.asyncio(loop_scope="module")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
HOSTILE = ('<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
           ' & "quotes"')
LONG = "cli:long"  # a transcript longer than one page
TOKEN = "the-inspector-t0ken-of-this-module"
PAGE = 50


def script(request) -> Response:
    """add X -> the todo tool; a tool result -> said back; anything else -> echoed."""
    last = request.messages[-1]
    spent = Usage(input_tokens=1200, output_tokens=40, cost_usd=0.02)
    if last.role == "tool":
        return Response(text=f"Tool said: {last.content}", usage=spent)
    if last.content.startswith("add "):
        return Response(text="", usage=spent, tool_calls=[ToolCall(
            id="t1", name="todo", arguments={"action": "add", "item": last.content[4:]})])
    return Response(text=f"echo: {last.content}", usage=spent)


async def write_history(store, tmp_path: Path) -> dict:
    """A history as Steward writes it: turns run by the real runner (tool calls, a
    document, usage), an approval left waiting, a fork, a long transcript, a schedule, a
    quarantined mail, and a second model's calls yesterday."""
    async with rig_factory(store, tmp_path) as make:
        ana = make(ScriptedModel(script))
        for text in ("add milk", "add eggs", HOSTILE):
            await ana.say(text, session="cli:ana", owner="ana")
            await ana.run()
        bob = make(ScriptedModel(script), config={"agent": {"approval_tools": ["todo"]}})
        await bob.say("add bread", session="cli:bob", owner="bob")
        await bob.run()
    ana_conv = await store.get_conversation("cli:ana")
    await store.fork("cli:ana", "cli:ana@2", at_seq=2)
    long = await store.ensure_conversation(LONG, owner="ana")
    w = Writes()
    for n in range(1, PAGE + 11):
        w.append(long.id, "user" if n % 2 else "assistant", f"line {n} of the long one",
                 author="ana" if n % 2 else None)
    w.save_schedule(ScheduleWrite(
        id="sch-digest", name="morning digest", prompt="Summarise my unread mail",
        trigger={"kind": "cron", "expr": "0 9 * * mon"}, timezone="Europe/Paris",
        deliver={"channel": "cli"}, next_fire_at=time.time() + 3600,
        conversation_id=ana_conv.id, owner="ana"))
    w.quarantine("email", "(1, 7) <broken@example.org>",
                 "malformed MIME: multipart without a boundary <b>bold</b>",
                 payload={"from": "mallory@example.org"})
    for _ in range(3):
        w.record_usage(UsageRecord(provider="p", model="big-model", input_tokens=5000,
                                   output_tokens=500, cost_usd=0.05,
                                   conversation_id=ana_conv.id))
    await store.commit(w)
    # The store stamps usage at commit; move the big model's calls to yesterday, as
    # tests/test_budget.py does, so the chart has two days.
    async with store.engines.write.begin() as conn:
        await conn.execute(update(usage).where(usage.c.model == "big-model")
                           .values(created_at=time.time() - 86400))
    w = Writes()  # and one today, on top of the scripted model's bar
    w.record_usage(UsageRecord(provider="p", model="big-model", input_tokens=5000,
                               output_tokens=500, cost_usd=0.05, conversation_id=ana_conv.id))
    await store.commit(w)
    return {"ana": ana_conv}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def site(request, tmp_path_factory):
    """A history on one backend, the inspector serving it on 127.0.0.1, and the config
    file that names that store (for `steward context`)."""
    tmp = tmp_path_factory.mktemp(request.param)
    schema = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / 'steward.db'}"
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        await _pg_admin(f'CREATE SCHEMA "{schema}"')
        url = f"{PG_URL}?schema={schema}"
    config_file = tmp / "config.toml"
    await asyncio.to_thread(config_file.write_text,
                            f'[store]\nurl = "{url}"\n[llm]\nprovider = "scripted"\n')
    home = tmp / "home"
    config = await asyncio.to_thread(load_config, str(config_file), str(home), {}, tmp)
    store = await open_store(url)
    try:
        made = await write_history(store, tmp)
        async with open_source(config) as source:
            runner = web.AppRunner(make_app(source, token=TOKEN), access_log=None)
            await runner.setup()
            server = web.TCPSite(runner, "127.0.0.1", 0)
            await server.start()
            base = f"http://127.0.0.1:{runner.addresses[0][1]}"
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                # The printed link, once: its cookie carries the token from then on.
                assert (await http.get(f"/?token={TOKEN}")).status_code == 303
                yield {"backend": request.param, "base": base, "http": http,
                       "source": source, "store": store, "config_file": config_file,
                       "home": home, "tmp": tmp, **made}
            await runner.cleanup()
    finally:
        await store.close()
        if schema:
            await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


# -- a browser, through chromedriver's WebDriver API --------------------------------------


class Browser:
    """Headless Chromium driven over WebDriver (the W3C protocol chromedriver speaks)."""

    def __init__(self, http: httpx.AsyncClient, session: str, shots: Path):
        self.http, self.session, self.shots = http, session, shots
        self.visited: set[str] = set()  # the sites whose cookie it has

    async def _call(self, method: str, path: str, body: dict | None = None):
        r = await self.http.request(method, f"/session/{self.session}{path}", json=body)
        r.raise_for_status()
        return r.json()["value"]

    async def open(self, url: str) -> None:
        await self._call("POST", "/url", {"url": url})

    async def visit(self, site: dict, path: str) -> None:
        """`path` as a person gets there: the printed link the first time (its token
        becomes a cookie, and leaves the address bar), then the plain address."""
        if site["base"] not in self.visited:
            await self.open(f"{site['base']}/?token={TOKEN}")
            assert await self._call("GET", "/url") == site["base"] + "/"
            self.visited.add(site["base"])
        await self.open(site["base"] + path)

    async def run(self, script: str):
        """JavaScript from the test (WebDriver's own channel: the page's CSP forbids any
        script of the page itself)."""
        return await self._call("POST", "/execute/sync", {"script": script, "args": []})

    async def text(self) -> str:
        return await self.run("return document.body.innerText")

    async def screenshot(self, name: str) -> Image.Image:
        png = base64.b64decode(await self._call("GET", "/screenshot"))
        await asyncio.to_thread((self.shots / f"{name}.png").write_bytes, png)
        return Image.open(io.BytesIO(png)).convert("RGB")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(tmp_path_factory):
    port = free_port()
    profile = tmp_path_factory.mktemp("chromium")
    shots = Path(os.environ.get("STEWARD_SHOTS") or tmp_path_factory.mktemp("shots"))
    await asyncio.to_thread(shots.mkdir, parents=True, exist_ok=True)
    driver = await asyncio.create_subprocess_exec(
        CHROMEDRIVER, f"--port={port}", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for _ in range(100):
                try:
                    if (await http.get("/status")).json()["value"]["ready"]:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            r = await http.post("/session", json={"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                    "--disable-dev-shm-usage", f"--user-data-dir={profile}",
                    "--window-size=1280,900"]}}}})
            r.raise_for_status()
            session = r.json()["value"]["sessionId"]
            try:
                yield Browser(http, session, shots)
            finally:
                await http.delete(f"/session/{session}")
    finally:
        driver.terminate()  # ours, by its pid
        await driver.wait()


def colours_of(image: Image.Image) -> dict[tuple, int]:
    return {c: n for n, c in image.getcolors(maxcolors=1 << 22)}


def assert_real_page(image: Image.Image) -> dict[tuple, int]:
    """Not blank: the header bar is drawn, there is text (anti-aliasing makes many
    shades), and the background is far from all of it."""
    assert image.width == 1280 and image.height > 700  # the window less its frame
    counts = colours_of(image)
    assert len(counts) > 150, f"only {len(counts)} colours: a blank or broken page"
    assert image.getpixel((4, 4)) == (0x1D, 0x2B, 0x4F)  # the header bar
    background = max(counts.values())
    assert background < 0.93 * image.size[0] * image.size[1]
    return counts


# -- the tests ---------------------------------------------------------------------------


async def page(site, path: str, **params) -> str:
    r = await site["http"].get(path, params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/html")
    return r.text


async def test_conversations_are_listed_with_forks_and_a_summary(site):
    html = await page(site, "/")
    for key in ("cli:ana", "cli:bob", LONG, "cli:ana@2"):
        assert f"/transcript?key={key.replace(':', '%3A').replace('@', '%40')}" in html
    assert "forked from" in html and "at 2" in html
    assert re.search(r"<b>1</b>approvals pending", html)
    assert re.search(r"<b>1</b>quarantined", html)


async def test_a_transcript_is_read_a_page_at_a_time(site):
    newest = await page(site, "/transcript", key=LONG)
    shown = [int(n) for n in re.findall(r'id="e(\d+)"', newest)]
    assert shown == list(range(PAGE + 10, 10, -1))  # the newest page, newest first
    assert "line 10 of" not in newest
    older = re.search(r'href="(/transcript\?key=cli%3Along&amp;before=11)"', newest)
    assert older, "no link to the older page"
    previous = await page(site, "/transcript", key=LONG, before=11)
    assert [int(n) for n in re.findall(r'id="e(\d+)"', previous)] == list(range(10, 0, -1))
    assert "← newer" in previous
    later = await page(site, "/transcript", key=LONG, after=55)
    assert [int(n) for n in re.findall(r'id="e(\d+)"', later)] == list(range(60, 55, -1))


async def test_a_fork_shows_its_parents_past(site):
    html = await page(site, "/transcript", key="cli:ana@2")
    assert "add milk" in html and "add eggs" not in html
    assert "forked from" in html


async def test_hostile_text_is_shown_as_text_and_never_runs(site, browser):
    html = await page(site, "/transcript", key="cli:ana")
    assert "<script>window.pwned" not in html and "<img src=x" not in html
    assert escape(HOSTILE) in html  # shown, escaped
    await browser.visit(site, "/transcript?key=cli:ana")
    pwned, scripts, images = await browser.run(
        "return [window.pwned === undefined ? null : window.pwned,"
        " document.scripts.length, document.images.length]")
    assert (pwned, scripts, images) == (None, 0, 0)
    text = await browser.text()
    assert HOSTILE in text  # the user's message, as they wrote it
    assert f"echo: {HOSTILE}" in text
    assert_real_page(await browser.screenshot(f"{site['backend']}-transcript"))


async def test_the_context_is_what_steward_context_gives(site):
    """The page shows `assemble` (what a turn sends), and that is what `steward context
    --json` prints."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(site["home"]), STEWARD_CONFIG=str(site["config_file"]))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "context", "cli:ana", "--json", env=env,
        cwd=site["tmp"], stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    cli = json.loads(out)
    source = site["source"]
    ours = (await assemble(source.store, source.config, site["ana"].id,
                                tools=source.tools, model=source.model)).request
    assert ours.model_dump(mode="json") == cli
    html = await page(site, "/context", key="cli:ana")
    assert f"Messages ({len(cli['messages'])})" in html
    assert f"Tools ({len(cli['tools'])})" in html
    for message in cli["messages"]:
        assert escape(message["content"]) in html
    for tool in cli["tools"]:
        assert f"<b>{escape(tool['name'])}</b>" in html


async def test_tasks_by_state_with_their_phases(site):
    # Bob's turn waits for its child; the approval sleeps (pending) in phase "waiting".
    # In words: what the task is, its conversation, its state, its step.
    waiting = await page(site, "/tasks", state="waiting")
    assert re.search(r">answer</a></td><td><a [^>]*>cli:bob</a></td><td><span class="
                     r"\"state-waiting\"[^>]*>waiting for its steps</span></td>"
                     r"<td>after_tools</td>", waiting)
    pending = await page(site, "/tasks", state="pending")
    assert re.search(r">approval</a></td><td><a [^>]*>cli:bob</a></td><td><span class="
                     r"\"state-pending\"[^>]*>waiting its turn</span></td><td>waiting</td>",
                     pending)
    assert re.search(r"waiting \(1\)", waiting)
    assert "is not running on this home" in waiting  # steward run's health, as doctor says
    done = await page(site, "/tasks", state="done")
    for kind in ("answer", "model call", "tool call: todo", "delivery"):
        assert f">{kind}</a></td>" in done
    [approval] = await site["store"].list_tasks(kind="approval", active=True)
    whole = await page(site, "/task", id=approval.id)
    assert "Checkpoint" in whole and "&quot;code&quot;" in whole
    assert "deliver" in whole  # its child: the request sent to bob
    r = await site["http"].get("/tasks", params={"state": "bogus"})
    assert r.status_code == 400 and "state must be one of" in r.text


async def test_a_document_as_of_any_entry(site):
    newest = await page(site, "/document", key="cli:ana", name="todo")
    assert "milk" in newest and "eggs" in newest
    doc = await site["store"].read_document(f"conversation:{site['ana'].id}", "todo")
    assert f"version {doc.version} (newest)" in newest
    before = await page(site, "/document", key="cli:ana", name="todo", at=doc.at_seq - 1)
    assert "milk" in before and "eggs" not in before
    listing = await page(site, "/document", key="cli:ana")
    assert 'name=todo' in listing
    first = await page(site, "/document", key="cli:ana", name="todo", at=1)
    assert "version 0 (as of entry #1)" in first and "milk" not in first.partition("<pre>")[2]
    r = await site["http"].get("/document", params={"key": "cli:nobody", "name": "todo"})
    assert r.status_code == 404 and "no conversation" in r.text


async def test_schedules_quarantine_and_approvals_pending(site):
    schedules = await page(site, "/schedules")
    assert "morning digest" in schedules
    assert "every Monday at 9:00 Paris time" in schedules
    quarantine = await page(site, "/quarantine")
    assert "malformed MIME" in quarantine and "&lt;b&gt;bold&lt;/b&gt;" in quarantine
    assert "mallory@example.org" in quarantine
    approvals = await page(site, "/approvals")
    [approval] = await site["store"].list_tasks(kind="approval", active=True)
    from bot.agent.approval import code_of

    assert f"<code>{code_of(approval.id)}</code>" in approvals
    assert "run the tool todo" in approvals and "bread" in approvals
    assert re.search(r"<td>waiting for bob since \d\d:\d\d</td>", approvals)


async def test_usage_per_day_and_model_is_a_chart(site, browser):
    html = await page(site, "/usage", days=7)
    assert html.count("<svg") == 2 and "big-model" in html and "scripted" in html
    # Yesterday the big model alone; today both, stacked.
    assert re.search(r"<title>[0-9-]+ · big-model: 0\.1500 USD</title>", html)
    assert re.search(r"<title>[0-9-]+ · big-model: 0\.0500 USD</title>", html)
    assert re.search(r"<title>[0-9-]+ · scripted: 0\.1200 USD</title>", html)
    assert re.search(r"<td>big-model</td><td>3</td>", html)
    await browser.visit(site, "/usage?days=7")
    shot = await browser.screenshot(f"{site['backend']}-usage")
    counts = assert_real_page(shot)
    # Both models' bars are drawn, in their colours (big-model first by name).
    for colour in PALETTE[:2]:
        rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        assert counts.get(rgb, 0) > 400, f"no bar in {colour}"
    assert "big-model" in await browser.text()


@pytest.mark.parametrize(("name", "path", "shown"), [
    ("approvals", "/approvals", "run the tool todo"),
    ("tasks", "/tasks", "after_tools"),
    ("context", "/context?key=cli:ana", "Messages ("),
    ("document", "/document?key=cli:ana&name=todo", '"eggs"'),
    ("quarantine", "/quarantine", "malformed MIME: multipart without a boundary <b>bold</b>"),
    ("conversations", "/", "cli:ana@2"),
])
async def test_every_area_renders_in_a_browser(site, browser, name, path, shown):
    await browser.visit(site, path)
    assert shown in await browser.text()
    assert_real_page(await browser.screenshot(f"{site['backend']}-{name}"))


async def test_read_only_and_locked_down(site):
    r = await site["http"].post("/", content=b"x")
    assert r.status_code == 405
    for path in ("/", "/nowhere", "/style.css"):
        r = await site["http"].get(path)
        assert r.headers["x-frame-options"] == "DENY"
        assert "script-src" not in r.headers["content-security-policy"]
        assert r.headers["content-security-policy"].startswith("default-src 'none'")
        assert r.headers["x-content-type-options"] == "nosniff"
    # A page that calls itself by another host name (DNS rebinding) is not answered, even
    # with the token.
    port = site["base"].rpartition(":")[2]
    r = await site["http"].get("/", headers={"Host": f"evil.example:{port}"})
    assert r.status_code == 421
    r = await site["http"].get("/", headers={"Host": f"localhost:{port}"})
    assert r.status_code == 200
    # Without the token, nothing, loopback or not.
    async with httpx.AsyncClient(base_url=site["base"]) as stranger:
        for path in ("/", "/transcript?key=cli:ana", "/style.css"):
            r = await stranger.get(path)
            assert r.status_code == 401 and "add milk" not in r.text


async def test_a_token_guards_every_page(site):
    """As `steward web --host 0.0.0.0` serves it (no Host check): nothing without the
    token."""
    runner = web.AppRunner(make_app(site["source"], token="t0ken-s3cret", loopback=False),
                           access_log=None)
    await runner.setup()
    server = web.TCPSite(runner, "127.0.0.1", 0)
    await server.start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with httpx.AsyncClient(base_url=base) as http:
            for path in ("/", "/transcript?key=cli:ana", "/usage", "/style.css"):
                r = await http.get(path)
                assert r.status_code == 401 and "ana" not in r.text
            assert (await http.get("/?token=wrong")).status_code == 401
            r = await http.get("/usage?days=7&token=t0ken-s3cret")
            assert r.status_code == 303 and r.headers["location"] == "/usage?days=7"
            assert "HttpOnly" in r.headers["set-cookie"]
            assert (await http.get("/usage?days=7")).status_code == 200  # the cookie
        async with httpx.AsyncClient(base_url=base) as http:
            bearer = {"Authorization": "Bearer t0ken-s3cret"}
            r = await http.get("/transcript?key=cli:ana", headers=bearer)
            assert r.status_code == 200 and "add milk" in r.text
    finally:
        await runner.cleanup()


async def test_serve_on_another_address_prints_a_token(site):
    """`serve` for real, in its own process: bound to all addresses, it makes up a token,
    prints the link, and answers only with it; SIGTERM stops it."""
    code = ("import asyncio, sys\n"
            "from bot.app.inspector.server import serve\n"
            "from bot.app.config import load_config\n"
            "asyncio.run(serve(load_config(sys.argv[1], sys.argv[2]), '0.0.0.0', 0, None))\n")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(site["config_file"]), str(site["home"]),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        m = re.search(r"http://0\.0\.0\.0:(\d+)/\?token=([\w-]{20,})", line)
        assert m, line
        port, token = m.groups()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/")).status_code == 401
            r = await http.get("/", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200 and "cli:ana" in r.text
    finally:
        proc.terminate()  # SIGTERM, to our own child
        await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0, (await proc.stderr.read()).decode()[-2000:]
