"""A Slack event that cannot be taken in is quarantined with its reason, never replayed
forever: a real `steward run` (HTTP mode, the fake Slack, the fake LLM) gets a signed event
whose ts is no Slack timestamp, next to a journal line of the same kind left by an older
process; it starts, answers the DM behind them, starts again and serves, and
`steward quarantine` lists both events with the reason."""

import asyncio
import json
import signal
import sys
from pathlib import Path

import httpx
import pytest

from store import open_store
from tests.fakes.llm_server import FakeLLMServer, Reply
from tests.fakes.slack_events import body_of, deliver, event_id, says
from tests.fakes.slack_rig import free_port
from tests.fakes.slack_server import FakeSlack
from tests.test_slack_crash import environment, make_home, start, until

ALICE = "U0ALICE"
DM = "D0ALICE"
ANSWER = "Noted, thank you."


@pytest.fixture
def llm():
    with FakeLLMServer(lambda _request, _wire: Reply(text=ANSWER)) as server:
        yield server


def not_a_ts_event(slack: FakeSlack, text: str) -> dict:
    """A signed-looking DM event whose `ts` is not a Slack timestamp."""
    stored, _ = says(slack, DM, ALICE, text)
    event = {"type": "message", "channel": DM, "channel_type": "im", "user": ALICE,
             "text": text, "ts": "notats", "event_ts": stored["ts"]}
    return body_of(event, eid=event_id())


async def pending_events(store, home: Path) -> set[str]:
    """The event ids Steward would take in again: its file journal's on SQLite, the shared
    journal's (the store's `inbound` table) on PostgreSQL."""
    if store.single_node:
        return pending_in_journal(home)
    from sqlalchemy import select

    from store.schema import inbound
    async with store.engines.read.connect() as conn:
        return set((await conn.execute(select(inbound.c.event_id))).scalars())


def pending_in_journal(home: Path) -> set[str]:
    """The event ids the file journal would replay on the next start."""
    pending: set[str] = set()
    path = home / "slack-inbox.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        if "event" in record:
            pending.add(record["event"].get("event_id") or "")
        else:
            pending.discard(record.get("done"))
    return pending


async def stop(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(proc.wait(), 30)
    log = (await proc.stderr.read()).decode()
    assert code == 0, log[-3000:]
    return log


async def quarantined(home: Path) -> list[dict]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "quarantine", "--json", env=environment(home, None),
        cwd=home, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-3000:]
    return [json.loads(line) for line in out.decode().splitlines()]


async def test_a_malformed_event_is_quarantined_and_never_stops_steward(store_url, tmp_path,
                                                                         llm, slack):
    home, port = tmp_path / "home", free_port()
    make_home(home, store_url, llm.url, slack.url, port)
    # What an older process acked and journaled: replayed on every start until now.
    left_over = not_a_ts_event(slack, "from before")
    (home / "slack-inbox.jsonl").write_text(json.dumps({"event": left_over}) + "\n")
    url = f"http://127.0.0.1:{port}/slack/events"

    first = await start(home, port)
    try:
        bad = not_a_ts_event(slack, "broken")
        _, good = says(slack, DM, ALICE, "please note this")
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await deliver(http, url, bad))[0] == 200  # acked: Slack must not retry
            assert (await deliver(http, url, good))[0] == 200
        await until(lambda: [m["text"] for m in slack.bot_messages(DM)] == [ANSWER], 60,
                    f"the answer; the DM shows {slack.bot_messages(DM)}")
    finally:
        log = await stop(first)
    assert "Traceback" not in log, log[-3000:]
    assert not pending_in_journal(home) & {left_over["event_id"], bad["event_id"]}
    kept = await open_store(store_url)
    try:
        assert not await pending_events(kept, home) & {left_over["event_id"], bad["event_id"]}
    finally:
        await kept.close()

    second = await start(home, port)  # starts: nothing is replayed that can stop it
    try:
        _, again = says(slack, DM, ALICE, "still there?")
        async with httpx.AsyncClient(timeout=20) as http:
            assert (await deliver(http, url, again))[0] == 200
        await until(lambda: len(slack.bot_messages(DM)) == 2, 60,
                    f"the second answer; the DM shows {slack.bot_messages(DM)}")
    finally:
        await stop(second)

    rows = {r["external_id"]: r for r in await quarantined(home)}
    assert set(rows) == {left_over["event_id"], bad["event_id"]}, rows
    for row in rows.values():
        assert row["channel"] == "slack"
        assert "ts" in row["reason"] and "notats" in row["reason"], row
