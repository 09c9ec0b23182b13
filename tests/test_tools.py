"""The tool layer: schemas from signatures, running and its error results, the tool box, and
the built-ins (the clock, http_get against a real local server, the to-do list on both
store backends)."""

import asyncio
import json
import re
import threading
import time
from dataclasses import replace
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Literal
from zoneinfo import ZoneInfo

import httpx
import pytest
from pydantic import BaseModel, Field

from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, ToolCall
from bot.runtime import Runner
from bot.runtime.definitions import NotPerformed, Policy
from bot.tools import (
    Tool,
    ToolBox,
    ToolContext,
    ToolModuleError,
    ToolResult,
    builtin_tools,
    tool,
)
from bot.tools.base import MAX_RESULT_CHARS
from bot.tools.builtin import current_time, html_to_text, http_get, todo
from bot.tools.netguard import NetGuard
from store import DONE, RUNNING, NotFound, Writes, conversation_namespace
from store.documents import DocumentConflict
from tests.fakes.agent_rig import RIG_OPTIONS, rig_factory


def make_ctx(**overrides) -> ToolContext:
    kwargs = dict(store=None, task_id="T1", conversation_id=None, conversation_key=None,
                  idem_key=None, writes=Writes(), http=None, timezone="UTC",
                  save_partial=None)
    kwargs.update(overrides)
    return ToolContext(**kwargs)


@pytest.fixture
async def make_rig(store, tmp_path):
    async with rig_factory(store, tmp_path) as make:
        yield make


def titles_in(node) -> list:
    """Every schema-level `title` (property names are not schema nodes)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "title":
                found.append(value)
            elif key in ("properties", "$defs"):
                for sub in value.values():
                    found += titles_in(sub)
            else:
                found += titles_in(value)
    elif isinstance(node, list):
        for item in node:
            found += titles_in(item)
    return found


# --- schemas -------------------------------------------------------------------------------


@tool
async def describe(ctx: ToolContext, name: str, count: int = 3, tag: str | None = None,
                   mode: Literal["fast", "slow"] = "fast", labels: list[str] | None = None,
                   note: Annotated[str, Field(description="a free note")] = "") -> dict:
    """Describe a thing.

    This second paragraph is not part of the description."""
    return {"name": name, "count": count, "tag": tag, "mode": mode, "labels": labels,
            "note": note, "task": ctx.task_id}


class Point(BaseModel):
    x: int
    y: int = 0
    label: str = Field("origin", description="what the point is")


@tool(name="place", description="Place a point.", policy=Policy.SAFE)
async def place_point(point: Point) -> str:
    return f"{point.label} at {point.x},{point.y}"


def test_schema_from_signature():
    schema = describe.parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["name"]
    props = schema["properties"]
    assert list(props) == ["name", "count", "tag", "mode", "labels", "note"]  # no ctx
    assert props["name"] == {"type": "string"}
    assert props["count"] == {"type": "integer", "default": 3}
    assert props["tag"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["mode"] == {"type": "string", "enum": ["fast", "slow"], "default": "fast"}
    assert props["labels"]["anyOf"][0] == {"type": "array", "items": {"type": "string"}}
    assert props["note"]["description"] == "a free note"
    assert schema["additionalProperties"] is False
    assert titles_in(schema) == []
    json.dumps(schema)  # plain JSON


def test_description_name_and_default_policy():
    assert describe.name == "describe"
    assert describe.description == "Describe a thing."
    assert describe.policy is Policy.UNSAFE
    assert describe.reconcile_fn is None
    spec = describe.spec()
    assert (spec.name, spec.description, spec.parameters) == (
        "describe", "Describe a thing.", describe.parameters)


def test_basemodel_parameter_is_the_arguments_schema():
    assert place_point.name == "place"
    assert place_point.policy is Policy.SAFE
    schema = place_point.parameters
    assert schema["type"] == "object"
    assert schema["required"] == ["x"]
    assert set(schema["properties"]) == {"x", "y", "label"}
    assert schema["properties"]["label"]["description"] == "what the point is"
    assert titles_in(schema) == []


def test_a_property_named_title_survives_and_reserved_names_work():
    @tool
    async def note(title: str, json: int = 1) -> str:
        """Take a note."""
        return f"{title}/{json}"

    assert set(note.parameters["properties"]) == {"title", "json"}
    assert note.parameters["properties"]["title"] == {"type": "string"}


async def test_reserved_parameter_name_is_passed_through():
    @tool
    async def note(title: str, json: int = 1) -> str:
        """Take a note."""
        return f"{title}/{json}"

    assert (await note.run(make_ctx(), {"title": "a", "json": 5})).content == "a/5"


def test_bad_tool_definitions_are_refused():
    with pytest.raises(TypeError, match="must be async"):
        @tool
        def blocking(x: int) -> int:
            """Block."""
            return x

    with pytest.raises(ValueError, match="needs a description"):
        @tool
        async def undocumented(x: int) -> int:
            return x

    with pytest.raises(ValueError, match="tool name"):
        @tool(name="has spaces", description="d")
        async def spaced() -> str:
            return ""


# --- run -----------------------------------------------------------------------------------


async def test_run_valid_call_and_json_result():
    result = await describe.run(make_ctx(), {"name": "café", "count": "7", "labels": ["a"]})
    assert result.is_error is False
    assert json.loads(result.content) == {"name": "café", "count": 7, "tag": None,
                                          "mode": "fast", "labels": ["a"], "note": "",
                                          "task": "T1"}
    assert "café" in result.content  # ensure_ascii=False


async def test_run_with_basemodel_argument():
    result = await place_point.run(make_ctx(), {"x": 2, "y": 5, "label": "p"})
    assert result == ToolResult("p at 2,5")


async def test_invalid_arguments_name_the_fields():
    result = await describe.run(make_ctx(), {"count": "many", "mode": "medium", "extra": 1})
    assert result.is_error
    assert result.content.startswith("error: invalid arguments: ")
    for field in ("name: Field required", "count:", "mode:", "extra:"):
        assert field in result.content
    assert "'many'" in result.content


async def test_raw_arguments_are_reported():
    result = await describe.run(make_ctx(), {"_raw": "{name: oops"})
    assert result.is_error
    assert "not a JSON object" in result.content and "{name: oops" in result.content
    result = await describe.run(make_ctx(), ["not", "a", "dict"])
    assert result.is_error and "expected a JSON object" in result.content


async def test_exception_becomes_error_result():
    @tool
    async def broken(x: int) -> str:
        """Fail."""
        raise RuntimeError(f"boom {x}")

    assert await broken.run(make_ctx(), {"x": 4}) == ToolResult(
        "error: RuntimeError: boom 4", is_error=True)


async def test_not_performed_propagates_to_the_runtime():
    @tool
    async def offline() -> str:
        """Never reaches the world."""
        raise NotPerformed("no connection")

    with pytest.raises(NotPerformed):
        await offline.run(make_ctx(), {})


async def test_long_results_are_truncated():
    @tool
    async def chatty(n: int) -> str:
        """Talk."""
        return "y" * n

    short = await chatty.run(make_ctx(), {"n": MAX_RESULT_CHARS})
    assert short.content == "y" * MAX_RESULT_CHARS
    long = await chatty.run(make_ctx(), {"n": MAX_RESULT_CHARS + 1234})
    assert long.content.startswith("y" * MAX_RESULT_CHARS + "\n[truncated: 1,234 more")
    assert len(long.content) < MAX_RESULT_CHARS + 100


async def test_tool_may_return_its_own_result_and_results_roundtrip():
    @tool
    async def picky() -> ToolResult:
        """Decline."""
        return ToolResult("not today", is_error=True)

    result = await picky.run(make_ctx(), {})
    assert result == ToolResult("not today", is_error=True)
    assert ToolResult.from_json(json.loads(json.dumps(result.to_json()))) == result
    assert ToolResult.from_json({"content": "x"}) == ToolResult("x")


async def test_reconcile():
    seen = []

    async def check(ctx: ToolContext, key: str) -> tuple[bool, str | None]:
        seen.append((ctx.idem_key, key))
        return (key == "sent"), "found it"

    @tool(reconcile=check)
    async def send(ctx: ToolContext, key: str) -> str:
        """Send."""
        return "sent"

    ctx = make_ctx(idem_key="K")
    assert await send.reconcile(ctx, {"key": "sent"}) == (True, ToolResult("found it"))
    assert await send.reconcile(ctx, {"key": "other"}) == (False, None)
    assert seen == [("K", "sent"), ("K", "other")]
    with pytest.raises(NotImplementedError):
        await describe.reconcile(ctx, {"name": "x"})


async def test_tool_constructed_directly_still_validates():
    async def double(ctx: ToolContext, n: int) -> int:
        return 2 * n

    t = Tool("double", "Double a number.", {"type": "object"}, "safe", double)
    assert t.policy is Policy.SAFE
    assert (await t.run(make_ctx(), {"n": 21})).content == "42"
    assert (await t.run(make_ctx(), {"n": "x"})).is_error


# --- the tool box --------------------------------------------------------------------------


def test_toolbox_registers_and_rejects_duplicates():
    box = ToolBox(*builtin_tools())
    box.register(describe)
    box.register(describe)  # the very same tool again: no-op
    assert box.names() == ["current_time", "describe", "http_get", "todo"]
    assert [s.name for s in box.specs()] == box.names()
    assert box.get("todo") is todo and box.get("nope") is None

    @tool(name="describe")
    async def impostor() -> str:
        """Another describe."""
        return ""

    with pytest.raises(ValueError, match="'describe' registered twice"):
        box.register(impostor)


def test_load_module(tmp_path, monkeypatch):
    (tmp_path / "my_steward_tools.py").write_text(
        "from bot.tools import tool, ToolContext\n"
        "from bot.tools.builtin import current_time\n"
        "\n"
        "@tool\n"
        "async def shout(text: str) -> str:\n"
        '    """Shout."""\n'
        "    return text.upper()\n"
        "\n"
        "@tool(policy='keyed')\n"
        "async def pay(ctx: ToolContext, cents: int) -> str:\n"
        '    """Pay."""\n'
        "    return ctx.idem_key\n"
        "\n"
        "NOT_A_TOOL = 3\n")
    (tmp_path / "broken_steward_tools.py").write_text("import no_such_module_here\n")
    (tmp_path / "empty_steward_tools.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    box = ToolBox(*builtin_tools())
    assert box.load_module("my_steward_tools") == ["current_time", "pay", "shout"]
    assert box.names() == ["current_time", "http_get", "pay", "shout", "todo"]
    assert box.get("pay").policy is Policy.KEYED

    with pytest.raises(ToolModuleError, match="'missing_steward_tools'.*ModuleNotFoundError"):
        box.load_module("missing_steward_tools")
    with pytest.raises(ToolModuleError, match="'broken_steward_tools'.*no_such_module_here"):
        box.load_module("broken_steward_tools")
    with pytest.raises(ToolModuleError, match="'empty_steward_tools' defines no tools"):
        box.load_module("empty_steward_tools")


async def test_load_module_result_runs(tmp_path, monkeypatch):
    (tmp_path / "echo_steward_tools.py").write_text(
        "from bot.tools import tool\n"
        "@tool\n"
        "async def echo(text: str) -> str:\n"
        '    """Echo."""\n'
        "    return text\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    box = ToolBox()
    box.load_module("echo_steward_tools")
    assert (await box.get("echo").run(make_ctx(), {"text": "hi"})).content == "hi"


# --- current_time --------------------------------------------------------------------------

ISO = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d) (\w+), timezone (\S+)")


def parse_time(content: str) -> tuple[datetime, str, str]:
    match = ISO.match(content)
    assert match, content
    return datetime.fromisoformat(match[1]), match[2], match[3]


@pytest.mark.parametrize("zone", ["Asia/Kolkata", "America/Los_Angeles", "UTC"])
async def test_current_time_in_a_given_zone(zone):
    result = await current_time.run(make_ctx(timezone="Europe/Paris"), {"timezone": zone})
    assert not result.is_error, result.content
    when, weekday, name = parse_time(result.content)
    expected = datetime.now(ZoneInfo(zone))
    assert abs((expected - when).total_seconds()) < 60
    assert when.utcoffset() == expected.utcoffset()
    assert weekday == when.strftime("%A") and name == zone


async def test_current_time_defaults_to_the_users_zone():
    result = await current_time.run(make_ctx(timezone="Asia/Tokyo"), {})
    when, _, name = parse_time(result.content)
    assert name == "Asia/Tokyo" and when.utcoffset().total_seconds() == 9 * 3600


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "../etc/passwd", "America"])
async def test_current_time_invalid_zone(zone):
    result = await current_time.run(make_ctx(), {"timezone": zone})
    assert result.is_error
    assert "unknown timezone" in result.content


# --- http_get against a real local server ----------------------------------------------------

BIG_CHUNK = 64 * 1024
BIG_CHUNKS = 80  # 5 MiB, sent slowly: reading it all would take over 1.5 s
HTML = ("<html><head><title>The Title</title><style>body { color: red }</style>"
        "<script>alert('hidden')</script></head><body><h1>Hello</h1>"
        "<p>some   <b>bold</b>\n  text &amp; more</p><ul><li>one</li><li>two</li></ul>"
        "</body></html>")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, body: bytes = b"", content_type: str = "text/plain",
              headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        server = self.server
        if self.path == "/text":
            self._send(200, "héllo wörld".encode(), "text/plain; charset=utf-8")
        elif self.path == "/latin1":
            self._send(200, "Grüße".encode("latin-1"), "text/plain; charset=iso-8859-1")
        elif self.path == "/html":
            self._send(200, HTML.encode(), "text/html; charset=utf-8")
        elif self.path == "/redirect":
            self._send(302, headers={"Location": "/hop"})
        elif self.path == "/hop":
            self._send(301, headers={"Location": f"http://{self.headers['Host']}/text"})
        elif self.path == "/loop":
            self._send(302, headers={"Location": "/loop"})
        elif self.path == "/to-file":
            self._send(302, headers={"Location": "file:///etc/passwd"})
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(BIG_CHUNK * BIG_CHUNKS))
            self.end_headers()
            try:
                for _ in range(BIG_CHUNKS):
                    self.wfile.write(b"x" * BIG_CHUNK)
                    self.wfile.flush()
                    server.big_sent += BIG_CHUNK
                    time.sleep(0.02)
            except OSError:
                pass  # the client hung up: that is the point
            finally:
                server.big_done.set()
        else:
            self._send(404, b"not here")


@pytest.fixture(scope="module")
def web():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    server.big_sent = 0
    server.big_done = threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
async def http():
    async with httpx.AsyncClient(trust_env=False) as client:
        yield client


def body_of(content: str) -> str:
    return content.split("\n\n", 1)[1]


def web_ctx(http) -> ToolContext:
    """The test server is on loopback, which http_get refuses unless the owner allowed it
    ([agent] http_allow = ["127.0.0.1"])."""
    ctx = make_ctx(http=http)
    ctx.netguard = NetGuard(["127.0.0.1"])
    return ctx


async def test_http_get_plain_text(web, http):
    _, base = web
    result = await http_get.run(web_ctx(http), {"url": f"{base}/text"})
    assert not result.is_error, result.content
    assert result.content.splitlines()[:3] == [
        "status: 200 OK", f"url: {base}/text", "content-type: text/plain; charset=utf-8"]
    assert body_of(result.content) == "héllo wörld"
    latin = await http_get.run(web_ctx(http), {"url": f"{base}/latin1"})
    assert body_of(latin.content) == "Grüße"


async def test_http_get_strips_html(web, http):
    _, base = web
    result = await http_get.run(web_ctx(http), {"url": f"{base}/html"})
    text = body_of(result.content)
    assert text == "The Title\nHello\nsome bold text & more\none\ntwo"
    assert html_to_text("<p>a<script>x</script>b</p>") == "ab"


async def test_http_get_follows_redirects(web, http):
    _, base = web
    result = await http_get.run(web_ctx(http), {"url": f"{base}/redirect"})
    assert f"url: {base}/text" in result.content
    assert body_of(result.content) == "héllo wörld"

    loop = await http_get.run(web_ctx(http), {"url": f"{base}/loop"})
    assert loop.is_error and "more than 5 redirects" in loop.content
    to_file = await http_get.run(web_ctx(http), {"url": f"{base}/to-file"})
    assert to_file.is_error and "only http and https" in to_file.content


async def test_http_get_reports_status(web, http):
    _, base = web
    result = await http_get.run(web_ctx(http), {"url": f"{base}/missing"})
    assert not result.is_error  # the fetch worked; the page is a 404
    assert result.content.startswith("status: 404 Not Found")


async def test_http_get_stops_reading_at_max_bytes(web, http):
    server, base = web
    started = time.monotonic()
    result = await http_get.run(web_ctx(http), {"url": f"{base}/big", "max_bytes": 1000})
    elapsed = time.monotonic() - started
    assert not result.is_error, result.content
    body, note = body_of(result.content).split("\n\n")
    assert body == "x" * 1000
    assert note == "[truncated: only the first 1,000 bytes of the body were read]"
    assert elapsed < 1.0
    # the server notices the hang-up long before it has sent the 5 MiB
    assert server.big_done.wait(10)
    assert server.big_sent < BIG_CHUNK * BIG_CHUNKS


async def test_http_get_caps_max_bytes_and_refuses_other_schemes(http):
    for url in ("file:///etc/passwd", "ftp://example.com/x", "example.com"):
        result = await http_get.run(make_ctx(http=http), {"url": url})
        assert result.is_error and "only http and https" in result.content
    result = await http_get.run(make_ctx(http=http), {"url": "http://x", "max_bytes": 0})
    assert result.is_error and "max_bytes" in result.content


# --- todo, end to end on both backends --------------------------------------------------------


async def test_todo_end_to_end(store, http):
    conv = await store.ensure_conversation("cli:todo")
    ns = conversation_namespace(conv.id)
    opening = Writes()
    opening.append(conv.id, "user", "keep a list for me")
    first_seq = (await store.commit(opening)).entry_seqs[0]

    async def call(arguments: dict) -> tuple[str, int, Writes]:
        writes = Writes()
        ctx = make_ctx(store=store, http=http, writes=writes, conversation_id=conv.id,
                       conversation_key=conv.key)
        result = await todo.run(ctx, arguments)
        assert not result.is_error, result.content
        documents = list(writes.documents)
        # as the runtime does: the tool's writes land with its result
        writes.append(conv.id, "tool_result", result.content)
        committed = await store.commit(writes)
        return result.content, committed.entry_seqs[-1], documents

    seen = []
    for arguments in ({"action": "add", "item": "buy milk"},
                      {"action": "add", "item": "call mum"},
                      {"action": "complete", "number": 1},
                      {"action": "remove", "number": 2}):
        content, seq, documents = await call(arguments)
        assert len(documents) == 1 and documents[0].name == "todo"
        seen.append((content, seq))

    assert [content for content, _ in seen] == [
        "1. [ ] buy milk",
        "1. [ ] buy milk\n2. [ ] call mum",
        "1. [x] buy milk\n2. [ ] call mum",
        "1. [x] buy milk",
    ]
    content, _, documents = await call({"action": "list"})
    assert content == "1. [x] buy milk" and documents == []  # reading writes nothing

    milk = {"id": 1, "text": "buy milk", "done": False}
    mum = {"id": 2, "text": "call mum", "done": False}
    expected = [
        {"items": [milk], "next_id": 2},
        {"items": [milk, mum], "next_id": 3},
        {"items": [{**milk, "done": True}, mum], "next_id": 3},
        {"items": [{**milk, "done": True}], "next_id": 3},
    ]
    for (_, seq), value in zip(seen, expected, strict=True):
        doc = await store.read_document(ns, "todo", as_of_seq=seq)
        assert doc.value == value
        assert doc.at_seq == seq
    before = await store.read_document(ns, "todo", as_of_seq=first_seq)
    assert before.value == {"items": []}
    latest = await store.read_document(ns, "todo")
    assert latest.value == expected[-1]

    # reopen, then a number that does not exist: an error result and no write
    content, _, _ = await call({"action": "reopen", "number": 1})
    assert content == "1. [ ] buy milk"
    writes = Writes()
    ctx = make_ctx(store=store, http=http, writes=writes, conversation_id=conv.id)
    bad = await todo.run(ctx, {"action": "complete", "number": 9})
    assert bad.is_error and "no item 9" in bad.content and "number is 1" in bad.content
    gone = await todo.run(ctx, {"action": "remove", "number": 2})  # removed: not reused
    assert gone.is_error and "no item 2" in gone.content
    unnamed = await todo.run(ctx, {"action": "remove"})
    assert unnamed.is_error and "needs `number`" in unnamed.content
    assert not writes
    missing = await todo.run(ctx, {"action": "add"})
    assert missing.is_error and "needs `item`" in missing.content
    assert not writes


async def test_todo_needs_a_conversation_and_starts_empty(store, http):
    conv = await store.ensure_conversation("cli:empty-todo")
    ctx = make_ctx(store=store, http=http, conversation_id=conv.id)
    assert (await todo.run(ctx, {"action": "list"})).content == "The to-do list is empty."
    assert not ctx.writes
    with pytest.raises(NotFound):
        await store.read_document(conversation_namespace(conv.id), "todo")
    nowhere = await todo.run(make_ctx(store=store, http=http), {"action": "list"})
    assert nowhere.is_error and "conversation" in nowhere.content


# --- to-do items keep their numbers; parallel calls; the runtime's re-run -----------------------


async def todo_in(store, conv, arguments: dict) -> tuple[ToolResult, Writes]:
    writes = Writes()
    ctx = make_ctx(store=store, writes=writes, conversation_id=conv.id)
    return await todo.run(ctx, arguments), writes


async def test_todo_items_keep_their_numbers_and_numbers_are_never_reused(store):
    conv = await store.ensure_conversation("cli:ids")
    for text in ("a", "b", "c"):
        result, writes = await todo_in(store, conv, {"action": "add", "item": text})
        await store.commit(writes)
    result, writes = await todo_in(store, conv, {"action": "remove", "number": 1})
    await store.commit(writes)
    assert result.content == "2. [ ] b\n3. [ ] c"  # b is still 2, c still 3
    result, writes = await todo_in(store, conv, {"action": "remove", "number": 3})
    await store.commit(writes)
    result, writes = await todo_in(store, conv, {"action": "add", "item": "d"})
    await store.commit(writes)
    assert result.content == "2. [ ] b\n4. [ ] d"  # 3 was given once: d gets 4
    result, writes = await todo_in(store, conv, {"action": "complete", "number": 4})
    await store.commit(writes)
    assert result.content == "2. [ ] b\n4. [x] d"
    listed, writes = await todo_in(store, conv, {"action": "list"})
    assert listed.content == result.content and not writes


async def test_a_todo_list_from_before_ids_is_numbered_as_it_was_shown(store):
    conv = await store.ensure_conversation("cli:old-todo")
    ns = conversation_namespace(conv.id)
    old = [{"text": "a", "done": False}, {"text": "b", "done": True}, {"text": "c", "done": False}]
    w = Writes()
    w.edit_document(ns, "todo", [{"op": "set", "path": ["items"], "value": old}],
                    initial={"items": []}, conversation_id=conv.id)
    await store.commit(w)
    listed, writes = await todo_in(store, conv, {"action": "list"})
    assert listed.content == "1. [ ] a\n2. [x] b\n3. [ ] c" and not writes  # reading: no write
    # a no-op on an old list writes nothing either (the ids come with a real change)
    same, writes = await todo_in(store, conv, {"action": "complete", "number": 2})
    assert same.content == listed.content and not writes
    result, writes = await todo_in(store, conv, {"action": "remove", "number": 2})
    await store.commit(writes)
    assert result.content == "1. [ ] a\n3. [ ] c"
    doc = await store.read_document(ns, "todo")
    assert doc.value == {"items": [{"text": "a", "done": False, "id": 1},
                                   {"text": "c", "done": False, "id": 3}], "next_id": 4}


async def test_a_todo_edit_from_a_stale_version_is_refused_and_its_rerun_is_right(store):
    conv = await store.ensure_conversation("cli:stale")
    for text in "abcd":
        _, writes = await todo_in(store, conv, {"action": "add", "item": text})
        await store.commit(writes)
    # two calls at once read the same version
    first, first_writes = await todo_in(store, conv, {"action": "remove", "number": 1})
    second, second_writes = await todo_in(store, conv, {"action": "remove", "number": 3})
    await store.commit(first_writes)
    with pytest.raises(DocumentConflict):
        await store.commit(second_writes)  # made against the version before `first`
    # the runtime runs a safe tool again: it reads the new version, 3 is still c
    again, again_writes = await todo_in(store, conv, {"action": "remove", "number": 3})
    await store.commit(again_writes)
    assert again.content == "2. [ ] b\n4. [ ] d"


def remove_calls(*numbers: int) -> Response:
    return Response(tool_calls=[
        ToolCall(id=f"r{n}", name="todo", arguments={"action": "remove", "number": n})
        for n in numbers])


async def test_parallel_todo_removals_remove_the_items_the_model_saw(store, make_rig):
    conv = await store.ensure_conversation("cli:rig")
    ns = conversation_namespace(conv.id)
    w = Writes()  # a list of eight, kept before items had ids
    w.edit_document(ns, "todo", [{"op": "set", "path": ["items"], "value": [
        {"text": t, "done": False} for t in "abcdefgh"]}], initial={"items": []},
        conversation_id=conv.id)
    await store.commit(w)
    rig = make_rig(ScriptedModel([remove_calls(1, 2, 3, 4), Response(text="Removed.")]))
    await rig.say("remove the first four", session="cli:rig")
    await rig.run()

    doc = await store.read_document(ns, "todo")
    assert [i["text"] for i in doc.value["items"]] == ["e", "f", "g", "h"]
    assert [i["id"] for i in doc.value["items"]] == [5, 6, 7, 8]
    log = await store.entries_page(conv.id, limit=50)
    results = [e for e in log if e.kind == "tool_result"]
    assert len(results) == 4 and not any(e.data["is_error"] for e in results)
    assert log[-1].text == "Removed."
    # every call ran on the version the one before it left: one version each
    assert doc.version == 1 + 4


async def test_many_parallel_edits_of_one_document_all_land(store, make_rig):
    # A conflict means another edit landed: contention, not a fault. With more parallel
    # edits than max_attempts, every one still gets through.
    conv = await store.ensure_conversation("cli:rig")
    ns = conversation_namespace(conv.id)
    rig = make_rig(ScriptedModel([Response(tool_calls=[
        ToolCall(id=f"a{n}", name="todo", arguments={"action": "add", "item": f"thing {n}"})
        for n in range(12)]), Response(text="Added.")]),
        config={"agent": {"max_tool_calls": 12}})  # more than one reply may make by default
    rig.runner = Runner(store, rig.registry, replace(RIG_OPTIONS, concurrency=12,
                                                     max_attempts=2))
    await rig.say("add twelve things")
    await rig.run()
    doc = await store.read_document(ns, "todo")
    assert sorted(i["text"] for i in doc.value["items"]) == sorted(
        f"thing {n}" for n in range(12))
    results = [e for e in await store.entries_page(conv.id, limit=50) if e.kind == "tool_result"]
    assert len(results) == 12 and not any(e.data["is_error"] for e in results)


async def test_a_keyed_tool_gets_the_same_key_when_it_runs_again_after_a_crash(
        store, make_rig):
    keys: list[str | None] = []
    inside = asyncio.Event()

    @tool(policy=Policy.KEYED)
    async def send_gift(ctx: ToolContext, to: str) -> str:
        """Send a gift; the shop drops a second order with the same key."""
        keys.append(ctx.idem_key)
        if len(keys) == 1:
            inside.set()
            await asyncio.Event().wait()  # the process dies in here
        return f"sent to {to}"

    model = ScriptedModel([
        Response(tool_calls=[ToolCall(id="g", name="send_gift", arguments={"to": "Ann"})]),
        Response(text="Sent.")])
    rig = make_rig(model, send_gift)
    turn = await rig.say("send Ann a gift")
    running = asyncio.create_task(rig.runner.run())
    await asyncio.wait_for(inside.wait(), 10)
    await rig.runner.drain(0)  # the crash: cut off inside the effect, nothing handed back
    await running
    [call] = await store.list_tasks(kind="tool_call")
    assert (call.state, call.phase) == (RUNNING, "effect")

    restarted = Runner(store, rig.registry, RIG_OPTIONS)  # the next process
    await restarted.recover(steal_all=True)
    await asyncio.wait_for(restarted.run(until_idle=True), 30)
    assert keys == [f"{turn}.0.0", f"{turn}.0.0"]  # re-sent with the key reserved for it
    assert (await store.get_task(call.id)).state == DONE
    assert (await store.get_task(turn)).result["text"] == "Sent."
