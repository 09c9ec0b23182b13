"""The inspector as the owner's window (issue 36): search across conversations, newest-first
transcripts paged by key, schedules, approvals and tasks in words (a stale lease is
"interrupted — will resume", not "running"), a health view, usage charts whose axes say
something at cents and agree with the totals.

Each page is fetched over HTTP from the real server and its DOM parsed (lxml), and each is
opened in headless Chromium: no console error, a screenshot in $STEWARD_SHOTS (default
/tmp/inspector-shots) for a person to look at.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, urlsplit
from zoneinfo import ZoneInfo

import httpx
import lxml.html
import pytest
import pytest_asyncio
from aiohttp import web
from sqlalchemy import update

from bot.app.backup import take_backup
from bot.app.config import load_config
from bot.app.inspector.server import make_app
from bot.app.inspector.source import open_source
from bot.runtime.supervision import HEALTH_FILE, Health
from store import ScheduleWrite, UsageRecord, Writes, open_store
from store.schema import tasks, usage
from tests.conftest import BACKENDS, PG_URL, _pg_admin
from tests.test_inspector import CHROMEDRIVER, CHROMIUM, Browser, assert_real_page, free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "the-owner-inspector-t0ken-0f-this-module"
ZONE = "Europe/Vienna"
VIENNA = ZoneInfo(ZONE)
LONG = "cli:long"
LONG_N = 120
PAGE = 50
HOSTILE = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
FAILED_ERROR = "the mail server said 550: mailbox unavailable"
SHOTS = Path(os.environ.get("STEWARD_SHOTS") or "/tmp/inspector-shots")


async def write_history(store) -> dict:
    now = time.time()
    anna = await store.ensure_conversation("slack:D0ANNA", owner="anna")
    mail = await store.ensure_conversation("email:anna@example.org", owner="anna")
    long = await store.ensure_conversation(LONG, owner="anna")
    w = Writes()
    w.append(anna.id, "user", "I went to the climbing gym on Thursday", author="Anna")
    w.append(anna.id, "assistant", "Nice! How was the climbing?")
    w.append(anna.id, "user", f"{HOSTILE} and my arms hurt", author="Anna")
    w.append(mail.id, "user", "Receipt for the climbing shoes, attached", author="Anna")
    for n in range(1, LONG_N + 1):
        w.append(long.id, "user" if n % 2 else "assistant", f"line {n} of the long one",
                 author="Anna" if n % 2 else None, created_at=now - (LONG_N - n) * 60)
    w.save_schedule(ScheduleWrite(
        id="sch-weekday", name="morning digest", prompt="Summarise my unread mail",
        trigger={"kind": "cron", "expr": "0 8 * * mon-fri"}, timezone=ZONE,
        deliver={"channel": "slack"}, next_fire_at=now + 3600, conversation_id=anna.id,
        owner="anna"))
    w.save_schedule(ScheduleWrite(
        id="sch-once", name="stretch", prompt="Remind Anna to stretch",
        trigger={"kind": "date", "at": "2026-12-07T09:00"}, timezone=ZONE,
        deliver={"channel": "slack"}, next_fire_at=now + 7200, conversation_id=anna.id))
    w.save_schedule(ScheduleWrite(
        id="sch-every", name="water", prompt="Say: drink water",
        trigger={"kind": "interval", "seconds": 7200}, timezone=ZONE,
        deliver={"channel": "slack"}, next_fire_at=now + 1200, conversation_id=anna.id))
    approval = w.spawn("approval", {
        "who": "Anna", "summary": "email the report to bob@example.org",
        "call": {"name": "send_email", "arguments": {"to": "bob@example.org"}},
        "channel": "slack", "expires_at": now + 86400, "reply_to": {}},
        conversation_id=anna.id)
    stale = w.spawn("llm_call", {"messages": []}, conversation_id=anna.id)
    live = w.spawn("tool_call", {"call": {"name": "web_fetch", "arguments": {}}},
                   conversation_id=anna.id)
    failed = w.spawn("deliver", {"channel": "email"}, conversation_id=mail.id)
    w.quarantine("email", "(1, 7) <broken@example.org>", "malformed MIME",
                 payload={"from": "mallory@example.org"})
    # The ledger: a free local model today; a cheap priced one ten days ago.
    for _ in range(5):
        w.record_usage(UsageRecord(provider="ollama", model="local-llama", input_tokens=900,
                                   output_tokens=80, cost_usd=0.0, conversation_id=anna.id))
    for cost in (0.001, 0.002):
        w.record_usage(UsageRecord(provider="p", model="tiny", input_tokens=300,
                                   output_tokens=20, cost_usd=cost, conversation_id=anna.id))
    await store.commit(w)
    async with store.engines.write.begin() as conn:
        # As a process left them: one killed holding its task (the lease ran out), one
        # alive and holding its own (this process), one delivery that failed an hour ago.
        await conn.execute(update(tasks).where(tasks.c.id == stale).values(
            state="running", phase="", lease_owner="gone-host:999999:01X",
            lease_expires=now - 120))
        await conn.execute(update(tasks).where(tasks.c.id == live).values(
            state="running", lease_owner=f"{socket.gethostname()}:{os.getpid()}:01Y",
            lease_expires=now + 600))
        await conn.execute(update(tasks).where(tasks.c.id == failed).values(
            state="failed", error=FAILED_ERROR, failure="fault", updated_at=now - 3600))
        await conn.execute(update(usage).where(usage.c.model == "tiny")
                           .values(created_at=now - 10 * 86400))
    return {"anna": anna, "mail": mail, "approval": approval, "stale": stale, "live": live,
            "failed": failed}


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def site(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"owner-{request.param}")
    schema = None
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp / 'steward.db'}"
    else:
        schema = f"t_{uuid.uuid4().hex[:12]}"
        await _pg_admin(f'CREATE SCHEMA "{schema}"')
        url = f"{PG_URL}?schema={schema}"
    config_file = tmp / "config.toml"
    await asyncio.to_thread(config_file.write_text, f'[store]\nurl = "{url}"\n[llm]\n'
                            f'provider = "scripted"\n[agent]\ntimezone = "{ZONE}"\n')
    home = tmp / "home"
    config = await asyncio.to_thread(load_config, str(config_file), str(home), {}, tmp)
    store = await open_store(url)
    try:
        made = await write_history(store)
        if request.param == "sqlite":
            await take_backup(config)  # a real one, as `steward backup` takes it
        await asyncio.to_thread(home.mkdir, mode=0o700, parents=True, exist_ok=True)
        health = Health(home)  # what a serving `steward run` (this process) says
        for name in ("runner", "scheduler", "intake"):
            health.loop(name).progressed()
        health.connected["slack"] = lambda: True
        await asyncio.to_thread((home / HEALTH_FILE).write_text, json.dumps(health.snapshot()))
        async with open_source(config) as source:
            runner = web.AppRunner(make_app(source, token=TOKEN), access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            base = f"http://127.0.0.1:{runner.addresses[0][1]}"
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                assert (await http.get(f"/?token={TOKEN}")).status_code == 303
                yield {"backend": request.param, "base": base, "http": http, "store": store,
                       "config": config, **made}
            await runner.cleanup()
    finally:
        await store.close()
        if schema:
            await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


async def dom(site, path: str, **params):
    r = await site["http"].get(path, params=params or None)
    assert r.status_code == 200, r.text
    return lxml.html.fromstring(r.text)


def words(node) -> str:
    return " ".join(node.text_content().split())


def rows(doc, table_id: str) -> list[list[str]]:
    return [[words(td) for td in tr.xpath("./td")]
            for tr in doc.xpath(f'//table[@id="{table_id}"]/tbody/tr')]


def shown_seqs(doc) -> list[int]:
    return [int(a.get("id")[1:]) for a in doc.xpath('//article[contains(@class, "entry")]')]


def href(doc, text: str) -> str:
    """Where the link(s) called `text` go (the pager is above and below: the same)."""
    [found] = {a.get("href") for a in doc.xpath("//a") if words(a) == text}
    return found


def params_of(link: str) -> dict:
    return {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}


# -- the tests ---------------------------------------------------------------------------

PAGES = ["/", "/tasks", "/approvals", "/schedules", "/quarantine", "/usage", "/health",
         "/search?q=climbing", f"/transcript?key={LONG}"]


@pytest.mark.parametrize("path", PAGES)
async def test_every_page_has_a_search_box(site, path):
    doc = await dom(site, path)
    [form] = doc.xpath('//header//form[@action="/search"][@method="get"]')
    assert form.xpath('.//input[@type="search"][@name="q"]')


async def test_search_finds_across_conversations_and_links_to_the_hit(site):
    doc = await dom(site, "/search", q="climbing")
    hits = doc.xpath('//article[contains(@class, "hit")]')
    keys = {words(h.xpath('.//a[@class="conversation"]')[0]) for h in hits}
    assert keys == {"slack:D0ANNA", "email:anna@example.org"}
    assert any("climbing gym" in words(h) for h in hits)
    assert all(h.xpath(".//mark") for h in hits), "the matched word is not marked"
    # Each result opens its transcript at the hit.
    link = href(doc, "show in the conversation") if len(hits) == 1 else \
        hits[0].xpath('.//a[@class="open"]')[0].get("href")
    at = params_of(link)
    assert link.endswith(f"#e{at['at']}")
    transcript = await dom(site, "/transcript", key=at["key"], at=at["at"])
    [hit] = transcript.xpath(f'//article[@id="e{at["at"]}"]')
    assert "hit" in hit.get("class")
    # Hostile text in a result and in the query is shown, never markup.
    hostile = await dom(site, "/search", q="arms hurt")
    assert not hostile.xpath("//script") and not hostile.xpath("//img")
    assert HOSTILE in words(hostile.xpath('//article[contains(@class, "hit")]')[0])
    query = await dom(site, "/search", q='<b>"climb')
    assert query.xpath('//input[@name="q"]')[0].get("value") == '<b>"climb'
    assert not query.xpath("//main//b[not(ancestor::article)][not(ancestor::div)]")
    none = await dom(site, "/search", q="zeppelin")
    assert "no matches" in words(none.xpath("//main")[0])


async def test_a_transcript_is_newest_first_and_paged_by_key(site):
    newest = await dom(site, "/transcript", key=LONG)
    assert shown_seqs(newest) == list(range(LONG_N, LONG_N - PAGE, -1))
    older = params_of(href(newest, "older →"))
    assert older == {"key": LONG, "before": str(LONG_N - PAGE + 1)}  # a key, no offset
    second = await dom(site, "/transcript", **older)
    assert shown_seqs(second) == list(range(LONG_N - PAGE, LONG_N - 2 * PAGE, -1))
    third = await dom(site, "/transcript", **params_of(href(second, "older →")))
    assert shown_seqs(third) == list(range(LONG_N - 2 * PAGE, 0, -1))
    assert not [a for a in third.xpath("//a") if words(a) == "older →"]
    back = await dom(site, "/transcript", **params_of(href(third, "← newer")))
    assert shown_seqs(back) == shown_seqs(second)
    assert shown_seqs(await dom(site, "/transcript", key=LONG, after=0)) == \
        list(range(PAGE, 0, -1))  # the oldest page
    # Landing at an entry: it is on the page, a few newer ones above it.
    at = await dom(site, "/transcript", key=LONG, at=30)
    seqs = shown_seqs(at)
    assert 30 in seqs and seqs[0] > 30 and seqs == sorted(seqs, reverse=True)


async def test_schedules_are_said_in_words(site):
    doc = await dom(site, "/schedules")
    by_name = {r[0]: r for r in rows(doc, "schedules")}
    assert "every weekday at 8:00 Vienna time" in by_name["morning digest"]
    assert "once on 7 Dec 2026 at 09:00 Vienna time" in by_name["stretch"]
    assert "every 2 hours" in by_name["water"]
    assert re.search(r"\(in \d+ min\)", " ".join(by_name["water"]))  # next, from now
    assert '{"kind"' not in words(doc.xpath("//main")[0])  # no raw trigger JSON


async def test_approvals_say_who_is_waited_for_since_when(site):
    doc = await dom(site, "/approvals")
    [row] = rows(doc, "approvals")
    task = await site["store"].get_task(site["approval"])
    since = datetime.fromtimestamp(task.created_at, UTC).astimezone(VIENNA)
    assert f"waiting for Anna since {since:%H:%M}" in row
    assert "may I email the report to bob@example.org?" in row


async def test_tasks_are_readable_and_a_stale_lease_is_interrupted(site):
    doc = await dom(site, "/tasks")
    listed = {tr.xpath(".//a[@title]")[0].get("title").removeprefix("task "):
              [words(td) for td in tr.xpath("./td")]
              for tr in doc.xpath('//table[@id="tasks"]/tbody/tr')}
    stale, live = listed[site["stale"]], listed[site["live"]]
    assert "interrupted — will resume" in stale and "running" not in stale
    assert "model call" in stale and "slack:D0ANNA" in stale
    assert "running" in live and "tool call: web_fetch" in live
    assert any(cell.endswith(" ago") or cell == "just now" for cell in stale)
    assert site["stale"] not in words(doc.xpath('//table[@id="tasks"]')[0])  # no ids
    whole = await dom(site, "/task", id=site["stale"])
    assert "interrupted — will resume" in words(whole.xpath("//main")[0])


async def test_health_shows_each_loop_the_last_backup_and_the_days_errors(site):
    doc = await dom(site, "/health")
    loops = {r[0]: r for r in rows(doc, "loops")}
    assert set(loops) == {"runner", "scheduler", "intake"}
    assert all("just now" in r for r in loops.values())
    assert "serving" in words(doc.xpath('//*[@id="service"]')[0])
    backup = words(doc.xpath('//*[@id="backup"]')[0])
    if site["backend"] == "sqlite":
        assert re.search(r"last good backup \d+ s ago", backup), backup
    else:
        assert "no backup" in backup
    errors = rows(doc, "errors")
    assert any(FAILED_ERROR in " ".join(r) and "delivery" in r for r in errors), errors
    assert "1 inbound item quarantined" in words(doc.xpath("//main")[0])


def y_labels(doc, chart: str) -> list[str]:
    [svg] = doc.xpath(f'//*[local-name()="svg"][@id="{chart}"]')
    return [t.text for t in svg.xpath('.//*[local-name()="text"][@class="y"]')]


async def test_usage_agrees_with_its_totals_when_the_calls_cost_nothing(site):
    doc = await dom(site, "/usage", days=7)
    summary = words(doc.xpath('//*[@id="totals"]')[0])
    assert summary.startswith("5 model calls, 0 USD")
    text = words(doc.xpath("//main")[0])
    assert "no model calls in this period" not in text
    assert "5 model calls, none with a cost" in text
    # The calls chart's bars add up to the total.
    bars = doc.xpath('//*[local-name()="svg"][@id="calls"]//*[local-name()="rect"]'
                     '/*[local-name()="title"]')
    assert sum(int(re.search(r": (\d+) calls", b.text).group(1)) for b in bars) == 5


async def test_usage_axes_carry_information_at_cents(site):
    doc = await dom(site, "/usage", days=30)
    assert words(doc.xpath('//*[@id="totals"]')[0]).startswith("7 model calls, 0.003 USD")
    labels = y_labels(doc, "cost")
    assert labels == ["0", "0.001", "0.002", "0.003", "0.004"], labels
    assert y_labels(doc, "calls")[-1] != y_labels(doc, "calls")[-2]


# -- in a browser ------------------------------------------------------------------------


class OwnerBrowser(Browser):
    async def visit(self, site: dict, path: str) -> None:
        """The printed link the first time (its token becomes a cookie), then `path`."""
        if site["base"] not in self.visited:
            await self.open(f"{site['base']}/?token={TOKEN}")
            assert await self._call("GET", "/url") == site["base"] + "/"
            self.visited.add(site["base"])
        await self.open(site["base"] + path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser(tmp_path_factory):
    """Headless Chromium over WebDriver, keeping the console's messages."""
    port = free_port()
    profile = tmp_path_factory.mktemp("chromium-owner")
    await asyncio.to_thread(SHOTS.mkdir, parents=True, exist_ok=True)
    driver = await asyncio.create_subprocess_exec(
        CHROMEDRIVER, f"--port={port}", stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            for _ in range(200):
                try:
                    if (await http.get("/status")).json()["value"]["ready"]:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
            r = await http.post("/session", json={"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:loggingPrefs": {"browser": "ALL"},
                "goog:chromeOptions": {"binary": CHROMIUM, "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--hide-scrollbars", "--disable-dev-shm-usage",
                    f"--user-data-dir={profile}", "--window-size=1280,1000"]}}}})
            r.raise_for_status()
            session = r.json()["value"]["sessionId"]
            try:
                yield OwnerBrowser(http, session, SHOTS)
            finally:
                await http.delete(f"/session/{session}")
    finally:
        driver.terminate()  # ours, by its pid
        await driver.wait()


async def console(browser: Browser) -> list[dict]:
    return await browser._call("POST", "/se/log", {"type": "browser"})


SHOWN = [("conversations", "/", "slack:D0ANNA"),
         ("search", "/search?q=climbing", "climbing gym"),
         ("transcript", f"/transcript?key={LONG}", f"line {LONG_N} of the long one"),
         ("transcript-at-hit", f"/transcript?key={LONG}&at=30#e30", "line 30 of"),
         ("tasks", "/tasks", "interrupted — will resume"),
         ("approvals", "/approvals", "waiting for Anna since"),
         ("schedules", "/schedules", "every weekday at 8:00 Vienna time"),
         ("health", "/health", "scheduler"),
         ("usage", "/usage?days=30", "7 model calls")]


@pytest.mark.parametrize(("name", "path", "shown"), SHOWN)
async def test_every_page_renders_in_chromium_without_console_errors(site, browser, name,
                                                                     path, shown):
    await console(browser)  # what earlier pages said is not this page's
    await browser.visit(site, path)
    assert shown in await browser.text()
    assert await browser.run("return document.scripts.length") == 0
    shot = await browser.screenshot(f"{site['backend']}-{name}")
    if "#" in path:  # scrolled to the hit: it is in sight, marked
        top, bottom, marked = await browser.run(
            "const e = document.getElementById(location.hash.slice(1));"
            "const r = e.getBoundingClientRect();"
            "return [r.top, r.bottom, e.classList.contains('hit')]")
        assert 0 <= top < bottom and marked
        assert len(shot.getcolors(maxcolors=1 << 22)) > 150
    else:
        assert_real_page(shot)
    said = [m for m in await console(browser) if m.get("level") in ("SEVERE", "WARNING")]
    assert said == [], said
