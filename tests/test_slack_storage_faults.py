"""The store and the journal's disk failing under a running Slack connector: a storage error
is never the message's fault, and nothing acknowledged is lost.

* The SQLite database cannot grow (`PRAGMA max_page_count` held at its page count, the
  free pages used up: a real SQLITE_FULL, "database or disk is full", on every write that
  needs a page) while reads still work and events keep arriving: none is quarantined,
  each is taken in by itself once there is room again (no restart) and answered once.
* The PostgreSQL server goes away (a TCP proxy in front of it is shut, its connections
  cut): the log says the store is unavailable, never Slack, and the event is answered
  once the server is back.
* The journal's disk fills in the middle of a write (a small tmpfs of the test's own): no
  torn line is left, the event whose line could not be written is not acknowledged (503:
  Slack sends it again), and every acknowledged event survives a restart.

Counted from what the fake Slack server received."""

from __future__ import annotations

import asyncio
import errno
import inspect
import json
import logging
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from bot.port import store_unavailable
from connectors.slack.journal import Journal
from store import Store, Writes, open_store
from tests.fakes.slack_events import mentions, says
from tests.fakes.slack_rig import SlackRig
from tests.fakes.slack_server import FakeSlack
from tests.fakes.small_disk import fill, mounted

ALICE, BOB = "U0ALICE", "U0BOB"
SLACK_PEOPLE = ((ALICE, "Alice"), (BOB, "Bob"))
CHAN = "C0FAULTS"
INBOUND = "connectors.slack.inbound"


async def until(check, within: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def answers_by_thread(slack: FakeSlack) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for m in slack.bot_messages(CHAN):
        found.setdefault(m.get("thread_ts") or "", []).append(m["text"])
    return found


def answered(slack: FakeSlack, asks: list[dict]) -> bool:
    threads = answers_by_thread(slack)
    return all(threads.get(a["ts"]) for a in asks)


def assert_each_answered_once(slack: FakeSlack, asks: list[dict], texts: list[str]) -> None:
    threads = answers_by_thread(slack)
    assert {ts: threads.get(ts) for ts in (a["ts"] for a in asks)} == {
        a["ts"]: [f"echo: {t}"] for a, t in zip(asks, texts, strict=True)}
    assert len(slack.bot_messages(CHAN)) == len(asks)  # nothing anywhere else


async def quarantined(store: Store) -> list[dict]:
    return await store.list_submissions(state="quarantined", channel="slack")


def records(caplog, logger: str, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == logger and words in r.getMessage()]


# -- the database cannot grow -----------------------------------------------------------


async def _pragma(store: Store, sql: str):
    """A PRAGMA on the store's own SQLite write connection (the writer thread's)."""
    return await store._writer.run(lambda s: s.raw.execute(sql).fetchone())


async def fill_database(store: Store) -> None:
    """Hold the database at its page count and use up its free pages: from here on every
    write that needs a page fails with SQLite's own SQLITE_FULL."""
    pages = (await _pragma(store, "PRAGMA page_count"))[0]
    await _pragma(store, f"PRAGMA max_page_count = {pages}")
    for i in range(100_000):
        w = Writes()
        w.edit_document("test:ballast", f"b{i}", [{"op": "set", "path": [], "value": "x" * 3000}],
                        history="latest")
        try:
            await store.commit(w)
        except Exception as exc:
            assert store_unavailable(exc), exc
            assert "database or disk is full" in str(exc), exc
            return
    raise AssertionError("the database never filled up")


async def free_database(store: Store) -> None:
    await _pragma(store, "PRAGMA max_page_count = 1073741823")


async def taken(store: Store, ask: dict) -> bool:
    return await store.submission_state("slack", f"{CHAN}:{ask['ts']}") is not None


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_a_database_that_cannot_be_written_holds_events_until_it_can(
        store, tmp_path, slack, caplog):
    caplog.set_level(logging.INFO, logger="connectors.slack")
    asks: list[dict] = []
    texts: list[str] = []

    async def ask(text: str) -> dict:
        top, body = says(slack, CHAN, ALICE, mentions(text))
        assert (await rig.send(body))[0] == 200  # the journal is not the database
        asks.append(top)
        texts.append(text)
        return top

    async with SlackRig(store, tmp_path, slack) as rig:
        await ask("before the disk filled")
        await until(lambda: answered(slack, asks), 30, "the first answer")
        await rig.settle()

        await fill_database(store)
        assert await store.get_conversation(f"slack:T0FAKE:{CHAN}:{asks[0]['ts']}")  # reads
        # Events keep coming. A write may still find room in a page it already has; ask
        # until one is certainly held: not taken in seconds after it was acknowledged.
        for i in range(40):
            top = await ask(f"while full {i}")
            try:
                await until(lambda t=top: taken(store, t), 3, "its submission")
            except AssertionError:
                break
        else:
            raise AssertionError("every write still found room")
        for i in range(3):
            await ask(f"more while full {i}")
        await asyncio.sleep(6)  # far longer than three attempts took (~1.2 s)
        assert await quarantined(store) == []

        await free_database(store)  # room again: taken in and answered by themselves
        await until(lambda: answered(slack, asks), 90, "every answer after the outage")
        await rig.settle(60)
        await asyncio.sleep(0.5)  # room for a wrong second answer to show up
    assert_each_answered_once(slack, asks, texts)
    assert await quarantined(store) == []
    # Said when it began and when it ended, not a traceback per event or try. (Once each,
    # unless a write found room again meanwhile: then that was an end, and a new start.)
    began = records(caplog, INBOUND, "the store is unavailable")
    assert 1 <= len(began) <= 3, caplog.text
    assert len(records(caplog, INBOUND, "the store is back")) == len(began), caplog.text
    assert not records(caplog, INBOUND, "Slack is unavailable"), caplog.text
    assert not [r for r in caplog.records if r.name == INBOUND and r.exc_info], caplog.text


# -- the PostgreSQL server goes away -----------------------------------------------------


class Proxy:
    """A TCP proxy in front of PostgreSQL: `down()` stops listening and cuts every
    connection through it (the server is gone), `up()` listens again on the same port."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def up(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def down(self) -> None:
        assert self._server is not None
        self._server.close()
        for w in list(self._writers):
            w.transport.abort()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._writers -= {writer, up_writer}


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
async def test_the_database_server_going_away_is_the_stores_outage_not_slacks(
        store_url, tmp_path, slack, caplog):
    caplog.set_level(logging.INFO, logger="connectors.slack")
    parts = urlsplit(store_url)
    proxy = Proxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    await proxy.up()
    netloc = f"{parts.username}@127.0.0.1:{proxy.port}" if parts.username else \
        f"127.0.0.1:{proxy.port}"
    store = await open_store(urlunsplit(parts._replace(netloc=netloc)))
    asks: list[dict] = []
    texts: list[str] = []
    try:
        async with SlackRig(store, tmp_path, slack, allowed_users=[ALICE, BOB]) as rig:
            top, body = says(slack, CHAN, ALICE, mentions("before the server went"))
            assert (await rig.send(body))[0] == 200
            asks.append(top)
            texts.append("before the server went")
            await until(lambda: answered(slack, asks), 30, "the first answer")
            await rig.settle()

            # Bob's first message: his profile is looked up before it is stored, and Slack
            # makes that slow (users.info answers 503 until the client's retries run out).
            # The server goes away meanwhile: acknowledged, then the store is gone.
            slack.fail("users.info", 503, times=4)
            top, body = says(slack, CHAN, BOB, mentions("asked as it went"))
            assert (await rig.send(body))[0] == 200
            asks.append(top)
            texts.append("asked as it went")
            await until(lambda: slack.count("users.info") >= 1, 20, "the profile look-up")
            await proxy.down()
            # Meanwhile an event cannot even be journaled (several workers share the
            # store's journal): it is not acknowledged, and Slack sends it again.
            top, late = says(slack, CHAN, ALICE, mentions("asked while it is gone"))
            refused, _ = await rig.send(late)
            assert refused != 200
            asks.append(top)
            texts.append("asked while it is gone")
            await until(lambda: records(caplog, INBOUND, "the store is unavailable"), 30,
                        "the store's outage to be noticed")
            await asyncio.sleep(4)
            assert not answered(slack, asks[1:2])

            await proxy.up()
            for retry in range(1, 30):  # Slack's retries, until one is acknowledged
                if (await rig.send(late, retry_num=retry))[0] == 200:
                    break
                await asyncio.sleep(1)
            else:
                raise AssertionError("the retried event was never acknowledged")
            await until(lambda: answered(slack, asks), 90, "every answer after the outage")
            await rig.settle(60)
            await asyncio.sleep(0.5)
        assert_each_answered_once(slack, asks, texts)
        assert await quarantined(store) == []
    finally:
        await store.close()
        if proxy._server is not None:
            await proxy.down()
    assert not records(caplog, INBOUND, "Slack is unavailable"), caplog.text
    assert len(records(caplog, INBOUND, "the store is unavailable")) == 1, caplog.text
    assert len(records(caplog, INBOUND, "the store is back")) == 1, caplog.text
    assert refused == 503  # said plainly, not a 500 from an exception


# -- the journal's disk fills up ---------------------------------------------------------


@pytest.fixture
def small_disk():
    """A 64 KiB tmpfs of the test's own."""
    with mounted("64k") as disk:
        yield disk


def body(n: int, text: str = "") -> dict:
    return {"event_id": f"Ev{n:04d}", "type": "event_callback",
            "event": {"type": "message", "ts": f"1700000000.{n:06d}", "text": text}}


def lines_of(path: Path) -> list[dict]:
    """Every line of the journal, each of which must be a whole record."""
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n"), raw[-80:]
    return [json.loads(line) for line in raw.decode().splitlines()]


async def test_a_journal_write_cut_short_by_a_full_disk_leaves_no_torn_line(small_disk):
    path = small_disk / "slack-inbox.jsonl"
    journal = Journal(path)
    await journal.open()
    await journal.append(body(1))
    good = path.stat().st_size
    ballast = fill(small_disk)
    # Larger than what is left of the journal's last page: part of it is written, then the
    # disk is full.
    with pytest.raises(OSError) as failed:
        await journal.append(body(2, "x" * 12_000))
    assert failed.value.errno == errno.ENOSPC
    assert path.stat().st_size == good  # cut back to the last good byte
    assert [r["event"]["event_id"] for r in lines_of(path)] == ["Ev0001"]
    journal.done("Ev0001")  # written lazily; fails, and goes with the next write
    await asyncio.sleep(0.2)

    ballast.unlink()
    await journal.append(body(3))  # acknowledged
    await journal.close()
    assert [next(iter(r.values())) for r in lines_of(path)][-1]["event_id"] == "Ev0003"
    again = Journal(path)
    assert [b["event_id"] for b in await again.open()] == ["Ev0003"]
    await again.close()


async def test_a_line_an_older_version_glued_to_a_torn_one_is_read_back(tmp_path):
    path = tmp_path / "slack-inbox.jsonl"
    torn = json.dumps({"event": body(2, "y" * 50)})[:37]
    path.write_text("\n".join([json.dumps({"event": body(1)}), torn + json.dumps(
        {"event": body(3)}), torn + json.dumps({"done": "Ev0001"})]) + "\n")
    journal = Journal(path)
    assert [b["event_id"] for b in await journal.open()] == ["Ev0003"]
    await journal.close()


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
async def test_an_event_the_journal_cannot_take_is_not_acked_and_acked_ones_survive(
        store, small_disk, slack):
    """Over HTTP: while the journal's disk is full the event gets a 503 (Slack sends it
    again) and no torn line; what was acknowledged, before and after, is answered after a
    restart even though the database could take none of it in the first life."""
    home = small_disk
    asks: list[dict] = []
    texts: list[str] = []
    first = SlackRig(store, home, slack)
    async with first as rig:
        await fill_database(store)  # nothing is taken in: all of it stays journaled
        top, early = says(slack, CHAN, ALICE, mentions("acknowledged first"))
        assert (await rig.send(early))[0] == 200
        asks.append(top)
        texts.append("acknowledged first")
        ballast = await asyncio.to_thread(fill, small_disk)
        long_text = "a question with a large event"
        top, cut = says(slack, CHAN, ALICE, mentions(long_text))
        # Its rich-text blocks make its line larger than what is left of the journal's last
        # page: part of it is written, then the disk is full.
        cut["event"]["blocks"] = [{"type": "rich_text", "block_id": "b1", "elements": [
            {"type": "rich_text_section", "elements": [{"type": "text", "text": "y" * 12_000}]}]}]
        status, _ = await rig.send(cut)
        assert status != 200  # not journaled, so not acknowledged
        assert all("event" in r or "done" in r for r in lines_of(home / "slack-inbox.jsonl"))
        await asyncio.to_thread(ballast.unlink)
        top2, later = says(slack, CHAN, ALICE, mentions("acknowledged after"))
        assert (await rig.send(later))[0] == 200
        assert (await rig.send(cut, retry_num=1))[0] == 200  # Slack's retry
        asks += [top, top2]
        texts += [long_text, "acknowledged after"]
        await asyncio.sleep(1.0)
    await free_database(store)

    async with SlackRig(store, home, slack) as rig:  # the next start replays the journal
        await until(lambda: answered(slack, asks), 60, "every acknowledged event answered")
        await rig.settle(60)
        await asyncio.sleep(0.5)
    assert_each_answered_once(slack, asks, texts)
    assert await quarantined(store) == []
    assert status == 503  # said plainly, not a 500 from an exception
