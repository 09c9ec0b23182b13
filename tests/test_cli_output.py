"""What `steward` prints at first contact: its version, listings with headers (and a line
saying so when there is nothing), `import`'s exit code, and a model that cannot be reached
answered in seconds with one line saying why. Real subprocesses, a real SQLite home."""

import json
import socket
import time
from importlib.metadata import version

import pytest

from bot.llm.errors import StreamError, Unreachable
from bot.llm.openai import OpenAIClient
from bot.llm.retry import stream_with_retries
from bot.llm.types import Message, Request
from store import ScheduleWrite, Writes, new_id, open_store
from tests.test_cli import steward


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


async def test_version(home):
    code, out, err = await steward(home, "--version")
    assert (code, out, err) == (0, f"steward {version('steward')}\n", "")


async def test_empty_listings_say_so_and_json_stays_empty(home):
    expected = {
        ("tasks",): "no tasks",
        ("tasks", "--state", "failed"): "no failed tasks",
        ("sessions",): "no conversations yet",
        ("schedules",): "no active schedules (--all also lists finished and cancelled ones)",
        ("schedules", "--all"): "no schedules",
        ("quarantine",): "nothing quarantined",
        ("quarantine", "--channel", "email"): "nothing quarantined from email",
    }
    for args, line in expected.items():
        code, out, err = await steward(home, *args)
        assert (code, out) == (0, line + "\n"), (args, err)
    for args in expected:
        code, out, err = await steward(home, *args, "--json")
        assert (code, out) == (0, ""), (args, err)
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    await store.ensure_conversation("cli:quiet")
    await store.close()
    code, out, _ = await steward(home, "log", "cli:quiet")
    assert out == "no entries in cli:quiet\n"
    code, out, _ = await steward(home, "log", "cli:quiet", "--before", "4")
    assert out == "no entries before 4 in cli:quiet\n"


async def test_listings_have_aligned_column_headers(home):
    store = await open_store(f"sqlite+aiosqlite:///{home / 'steward.db'}")
    conv = await store.ensure_conversation("cli:a-longer-name")
    await store.ensure_conversation("cli:b")
    w = Writes()
    w.append(conv.id, "user", "hello")
    w.save_schedule(ScheduleWrite(new_id(), "plants", "water\nthem", {
        "kind": "cron", "expr": "0 9 * * *"}, "UTC", {"channel": "cli"}, 4102444800.0,
        conv.id))
    w.quarantine("email", "imap:7:42", "malformed MIME: " + "x" * 200)
    w.spawn("compact", {"reason": "listed, not run"}, conversation_id=conv.id)
    await store.commit(w)
    await store.close()

    code, out, err = await steward(home, "sessions")
    assert code == 0, err
    header, *rows = out.splitlines()
    assert header.split() == ["KEY", "ENTRIES", "UPDATED"]
    assert [r.split()[:2] for r in rows] == [["cli:b", "0"], ["cli:a-longer-name", "1"]]
    # aligned: each column starts where its header does
    assert {r.index(r.split()[1]) for r in rows} == {header.index("ENTRIES")}

    code, out, _ = await steward(home, "schedules")
    header, row = out.splitlines()
    assert header.split() == ["ID", "STATE", "NEXT", "NAME", "SESSION", "FROM"]
    assert row.split()[1:] == ["active", "2100-01-01T00:00:00+00:00", "plants",
                               "cli:a-longer-name", "you"]

    code, out, _ = await steward(home, "quarantine")
    header, row = out.splitlines()
    assert header.split() == ["TS", "CHANNEL", "EXTERNAL_ID", "REASON"]
    assert row.endswith("malformed MIME: " + "x" * 43 + "…")  # a long cell is cut

    code, out, _ = await steward(home, "tasks")
    header, row = out.splitlines()
    assert header.split() == ["ID", "KIND", "STATE", "PHASE", "ATTEMPTS", "FAILURE", "ERROR"]
    assert row.split()[1:] == ["compact", "pending", "-", "0", "-", "-"]


async def test_import_with_malformed_lines_exits_1_with_their_count(home):
    good = [json.dumps({"session": "cli:old", "role": "user", "text": f"line {n}",
                        "ts": f"2024-03-0{n}T10:00:00Z"}) for n in range(1, 4)]
    (home / "old.jsonl").write_text("\n".join([good[0], "{not json", good[1], '{"role": 1}',
                                               good[2]]) + "\n")
    code, out, err = await steward(home, "import", "old.jsonl")
    assert code == 1
    lines = err.splitlines()
    assert lines[:2] == ["  line 2: not JSON: Expecting property name enclosed in double "
                         "quotes: line 1 column 2 (char 1)", "  line 4: missing session"]
    assert lines[2].startswith("imported 3 new entries from old.jsonl (jsonl): 3 messages")
    assert lines[3:] == ["steward: 2 malformed lines skipped; imported the rest (3 new)"]
    code, out, _ = await steward(home, "log", "cli:old", "--json")
    assert [json.loads(line)["text"] for line in out.splitlines()] == [
        "line 1", "line 2", "line 3"]
    # a clean file: exit 0, as before
    (home / "clean.jsonl").write_text("\n".join(good) + "\n")
    code, _, err = await steward(home, "import", "clean.jsonl")
    assert code == 0 and "steward:" not in err, err


async def test_ask_with_the_provider_unreachable_fails_fast_in_one_line(home):
    port = closed_port()
    (home / "config.toml").write_text(
        f'[llm]\nbase_url = "http://127.0.0.1:{port}/v1"\nmodel = "m"\n')
    started = time.monotonic()
    code, out, err = await steward(home, "ask", "are you there?")
    took = time.monotonic() - started
    assert code == 1, (out, err)
    assert err.splitlines() == [
        f"steward: the model gave no answer: openai: ConnectError: All connection attempts "
        f"failed (http://127.0.0.1:{port}/v1)"]
    assert out.startswith("Sorry, I could not get an answer from the model")
    # Two quick tries, not a minute of backoff (a loaded CI machine took 14.6 s).
    assert took < 30, f"{took:.1f} s"
    # what the conversation keeps: the question and the apology, once each
    code, out, _ = await steward(home, "log", "cli:default", "--json")
    assert [json.loads(line)["kind"] for line in out.splitlines()] == ["user", "assistant"]


class Calls:
    def __init__(self):
        self.attempts = 0
        self.waits: list[float] = []

    async def on_attempt(self, _response, _error):
        self.attempts += 1

    async def sleep(self, seconds):
        self.waits.append(seconds)


async def test_an_unreachable_provider_is_tried_twice_then_given_up(http_client):
    client = OpenAIClient(http_client, base_url=f"http://127.0.0.1:{closed_port()}/v1",
                          api_key=None, model="m")
    calls = Calls()
    with pytest.raises(Unreachable):
        await stream_with_retries(client, Request(model="m", messages=[
                                      Message(role="user", content="hi")]),
                                  on_attempt=calls.on_attempt, sleep=calls.sleep,
                                  max_attempts=5, base_delay=1.0, max_delay=60.0)
    assert calls.attempts == 2 and len(calls.waits) == 1 and calls.waits[0] <= 1.0
    assert issubclass(Unreachable, StreamError)  # still transient, still a stream error


@pytest.fixture
async def http_client():
    import httpx

    async with httpx.AsyncClient(trust_env=False) as client:
        yield client
