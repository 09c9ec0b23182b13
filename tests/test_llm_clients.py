"""LLM clients against a real local HTTP server speaking both wire formats, the scripted
model, retries, and choosing a client from the config."""

import json
import socket
import time
from email.utils import formatdate

import httpx
import pytest

from bot.config import LLMConfig
from bot.llm.anthropic import AnthropicClient
from bot.llm.errors import (
    AuthError,
    ContextOverflow,
    RateLimited,
    RequestError,
    ServerError,
    StreamError,
)
from bot.llm.factory import DEMO_BANNER, make_client
from bot.llm.http_errors import retry_after
from bot.llm.openai import OpenAIClient
from bot.llm.retry import stream_with_retries
from bot.llm.scripted import ScriptedModel, demo_model
from bot.llm.types import Message, Request, Response, ToolCall, ToolSpec, Usage
from tests.fakes.llm_server import FakeLLMServer, Reply, replies

WIRES = pytest.mark.parametrize("wire", ["openai", "anthropic"])
PATH = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
TOOLS = [
    ToolSpec(name="current_time", description="The current time.",
             parameters={"type": "object", "properties": {}}),
    ToolSpec(name="todo", description="Manage the todo list.",
             parameters={"type": "object", "properties": {"action": {"type": "string"},
                                                          "item": {"type": "string"}}}),
]


def ask(text: str = "hi", tools=()) -> Request:
    return Request(model="", messages=[Message(role="system", content="Be brief."),
                                       Message(role="user", content=text)], tools=list(tools))


@pytest.fixture
def server():
    with FakeLLMServer() as s:
        yield s


@pytest.fixture
async def http():
    async with httpx.AsyncClient(timeout=5.0, trust_env=False) as client:
        yield client


def client_for(wire, server, http):
    if wire == "openai":
        return OpenAIClient(http, base_url=f"{server.url}/v1", api_key="sk-test", model="gpt-t")
    return AnthropicClient(http, base_url=server.url, api_key="ak-test", model="claude-t")


class Recorder:
    """on_text / on_retry / on_attempt / sleep hooks that remember what they saw."""

    def __init__(self):
        self.deltas, self.retries, self.attempts, self.sleeps = [], [], [], []

    async def on_text(self, delta):
        self.deltas.append(delta)

    async def on_retry(self, attempt, error, delay):
        self.retries.append((attempt, type(error), delay))
        self.deltas.clear()  # the partial stream of the failed attempt is discarded

    async def on_attempt(self, response, error):
        self.attempts.append(response if error is None else type(error))

    async def sleep(self, seconds):
        self.sleeps.append(seconds)


async def retrying(client, rec, request=None, **kw):
    return await stream_with_retries(client, request or ask(), rec.on_text,
                                     on_attempt=rec.on_attempt, on_retry=rec.on_retry,
                                     sleep=rec.sleep, **kw)


# ---------------------------------------------------------------- both wire formats


@WIRES
async def test_text_streams_in_deltas(wire, server, http):
    text = "Hello there, this answer arrives in pieces."
    server.responder = lambda _body, _wire: Reply(text=text, chunk_chars=4)
    rec = Recorder()
    response = await client_for(wire, server, http).stream(ask(), rec.on_text)
    assert len(rec.deltas) > 1 and "".join(rec.deltas) == text == response.text
    assert (response.stop_reason, response.model, response.tool_calls) == ("stop", "fake-model", [])


@WIRES
async def test_parallel_tool_calls_with_streamed_arguments(wire, server, http):
    calls = [("call_a", "todo", {"action": "add", "item": "buy oat milk and bread"}),
             ("call_b", "current_time", {"zone": "Europe/Paris"})]
    server.responder = lambda _body, _wire: Reply(text="Let me see.", tool_calls=calls,
                                                  chunk_chars=6)
    response = await client_for(wire, server, http).stream(ask(tools=TOOLS))
    assert response.tool_calls == [ToolCall(id=i, name=n, arguments=a) for i, n, a in calls]
    assert response.stop_reason == "tool_calls" and response.text == "Let me see."


@WIRES
async def test_arguments_that_are_not_a_json_object_arrive_raw(wire, server, http):
    server.responder = lambda _b, _w: Reply(tool_calls=[("c1", "todo", '{"item": "x"'),
                                                        ("c2", "todo", "[1, 2]")])
    response = await client_for(wire, server, http).stream(ask(tools=TOOLS))
    assert [c.arguments for c in response.tool_calls] == [{"_raw": '{"item": "x"'},
                                                          {"_raw": "[1, 2]"}]


@WIRES
async def test_usage_is_parsed(wire, server, http):
    server.responder = lambda _b, _w: Reply(text="ok", usage=(1200, 34), cache_read=1000)
    usage = (await client_for(wire, server, http).stream(ask())).usage
    # input_tokens is the whole prompt for both: Anthropic's own count excludes cache reads
    whole = 1200 if wire == "openai" else 2200
    assert usage == Usage(input_tokens=whole, output_tokens=34, cache_read_tokens=1000)


async def test_a_cost_reported_by_the_provider_is_kept(server, http):
    server.responder = lambda _b, _w: Reply(text="ok", usage=(100, 10), cost=0.00042)
    usage = (await client_for("openai", server, http).stream(ask())).usage
    assert usage.cost_usd == 0.00042


def test_cost_from_configured_prices():
    llm = LLMConfig(input_price_per_mtok=3.0, output_price_per_mtok=15.0,
                    cache_read_price_per_mtok=0.3)
    usage = Usage(input_tokens=1_000_000, output_tokens=100_000, cache_read_tokens=400_000,
                  cache_write_tokens=100_000)
    # fresh 500k x 3 + read 400k x 0.3 + write 100k x 3 (input price) + out 100k x 15
    assert llm.cost_usd(usage) == pytest.approx(1.5 + 0.12 + 0.3 + 1.5)
    assert LLMConfig().cost_usd(usage) == 0.0  # not priced


@WIRES
async def test_rate_limit_honours_retry_after(wire, server, http):
    limited = Reply(status=429, headers={"Retry-After": "7"})
    server.responder = replies(limited, limited, Reply(text="ok"))
    client = client_for(wire, server, http)
    with pytest.raises(RateLimited) as caught:
        await client.stream(ask())
    assert caught.value.retry_after == 7 and caught.value.status == 429
    rec = Recorder()
    response = await retrying(client, rec)
    assert response.text == "ok" and rec.sleeps == [7.0]
    assert rec.attempts == [RateLimited, response] and server.count(PATH[wire]) == 3


@WIRES
async def test_server_errors_are_retried_with_backoff(wire, server, http):
    server.responder = replies(Reply(status=500), Reply(status=529), Reply(text="fine"))
    rec = Recorder()
    response = await retrying(client_for(wire, server, http), rec, rand=lambda: 0.5)
    assert response.text == "fine" and rec.sleeps == [0.5, 1.0]
    assert rec.attempts == [ServerError, ServerError, response]


@WIRES
async def test_cut_stream_is_a_stream_error_and_the_retry_starts_over(wire, server, http):
    server.responder = replies(Reply(text="this will not be finished", cut_after=4),
                               Reply(text="complete answer"))
    client = client_for(wire, server, http)
    rec = Recorder()
    with pytest.raises(StreamError):
        await client.stream(ask(), rec.on_text)
    assert rec.deltas  # part of the text did arrive before the cut
    server.responder = replies(Reply(text="cut again", cut_after=3), Reply(text="complete"))
    rec = Recorder()
    response = await retrying(client, rec, rand=lambda: 0.0)
    assert rec.retries == [(1, StreamError, 0.0)]
    assert "".join(rec.deltas) == response.text == "complete"


@WIRES
async def test_slow_stream_completes(wire, server, http):
    server.responder = lambda _b, _w: Reply(text="slow but steady", chunk_chars=3, delay=0.04)
    started = time.monotonic()
    response = await client_for(wire, server, http).stream(ask())
    assert response.text == "slow but steady" and time.monotonic() - started >= 0.2


@WIRES
async def test_stalled_stream_times_out_as_stream_error(wire, server):
    server.responder = lambda _b, _w: Reply(text="abcdefgh", chunk_chars=2, delay=0.6)
    async with httpx.AsyncClient(timeout=httpx.Timeout(5.0, read=0.2), trust_env=False) as h:
        with pytest.raises(StreamError, match="ReadTimeout"):
            await client_for(wire, server, h).stream(ask())


@WIRES
async def test_connection_refused_is_a_stream_error(wire, http):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dead = type("Dead", (), {"url": f"http://127.0.0.1:{port}"})()
    with pytest.raises(StreamError):
        await client_for(wire, dead, http).stream(ask())


@WIRES
async def test_auth_error_names_the_env_var_and_is_not_retried(wire, server, http):
    server.responder = lambda _b, _w: Reply(status=401)
    rec = Recorder()
    with pytest.raises(AuthError, match=KEY_ENV[wire]):
        await retrying(client_for(wire, server, http), rec)
    assert rec.attempts == [AuthError] and server.count(PATH[wire]) == 1


CONTEXT_BODIES = {
    "openai": {"error": {"message": "This model's maximum context length is 128000 tokens.",
                         "type": "invalid_request_error", "code": "context_length_exceeded"}},
    "anthropic": {"type": "error", "error": {"type": "invalid_request_error",
                                             "message": "prompt is too long: 210000 > 200000"}},
}


@WIRES
@pytest.mark.parametrize("status", [400, 413])
async def test_context_overflow_is_not_retried(wire, status, server, http):
    body = CONTEXT_BODIES[wire] if status == 400 else None
    server.responder = lambda _b, _w: Reply(status=status, error_body=body)
    with pytest.raises(ContextOverflow):
        await retrying(client_for(wire, server, http), Recorder())
    assert server.count(PATH[wire]) == 1


@WIRES
async def test_bad_request_is_a_request_error(wire, server, http):
    server.responder = lambda _b, _w: Reply(status=400)
    with pytest.raises(RequestError, match="HTTP 400") as caught:
        await retrying(client_for(wire, server, http), Recorder())
    assert caught.value.status == 400 and "invalid_request_error" in caught.value.body
    assert server.count(PATH[wire]) == 1


@WIRES
async def test_error_inside_the_stream(wire, server, http):
    overloaded = {"type": "overloaded_error", "message": "Overloaded"}
    event = {"type": "error", "error": overloaded} if wire == "anthropic" else {
        "error": overloaded}
    server.responder = lambda _b, _w: Reply(text="partial", stream_error=event)
    with pytest.raises(ServerError, match="Overloaded"):
        await client_for(wire, server, http).stream(ask())


# ---------------------------------------------------------------- what goes on the wire

HISTORY = [
    Message(role="system", content="You are Steward."),
    Message(role="user", content="What time is it, and add milk to my todo."),
    Message(role="assistant", content="Checking.", tool_calls=[
        ToolCall(id="c1", name="current_time", arguments={}),
        ToolCall(id="c2", name="todo", arguments={"action": "add", "item": "milk"})]),
    Message(role="tool", tool_call_id="c1", name="current_time", content="09:30"),
    Message(role="tool", tool_call_id="c2", name="todo", content="list is full", is_error=True),
]


async def test_openai_wire_format(server, http):
    await client_for("openai", server, http).stream(Request(model="", messages=HISTORY,
                                                            tools=TOOLS[:1], temperature=0.2))
    sent = server.requests[-1]
    assert sent.headers["authorization"] == "Bearer sk-test"
    body = sent.body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("gpt-t", 4096, 0.2)
    assert body["tools"] == [{"type": "function", "function": {
        "name": "current_time", "description": "The current time.",
        "parameters": {"type": "object", "properties": {}}}}]
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool",
                                                     "tool"]
    assistant = body["messages"][2]
    assert [json.loads(c["function"]["arguments"]) for c in assistant["tool_calls"]] == [
        {}, {"action": "add", "item": "milk"}]
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "09:30"}
    assert body["messages"][4]["content"] == "Error: list is full"


async def test_openai_without_a_key_sends_no_authorization(server, http):
    client = OpenAIClient(http, base_url=f"{server.url}/v1", api_key=None, model="llama3")
    assert (await client.stream(ask())).text == "ok"
    assert "authorization" not in server.requests[-1].headers


async def test_anthropic_wire_format(server, http):
    steer = Message(role="user", content="Also: it is urgent.")
    await client_for("anthropic", server, http).stream(
        Request(model="", messages=[*HISTORY, steer], tools=TOOLS[:1]))
    sent = server.requests[-1]
    assert sent.headers["x-api-key"] == "ak-test"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    body = sent.body
    assert body["stream"] is True and body["system"][0]["text"] == "You are Steward."
    assert body["tools"] == [{"name": "current_time", "description": "The current time.",
                              "input_schema": {"type": "object", "properties": {}}}]
    user, assistant, results = body["messages"]
    assert (user["role"], assistant["role"], results["role"]) == ("user", "assistant", "user")
    assert assistant["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "c1", "name": "current_time", "input": {}},
        {"type": "tool_use", "id": "c2", "name": "todo",
         "input": {"action": "add", "item": "milk"}}]
    first, second, text = results["content"]  # both results and the steer: one user message
    assert first == {"type": "tool_result", "tool_use_id": "c1", "content": "09:30"}
    assert second["is_error"] is True and second["tool_use_id"] == "c2"
    assert text["text"] == "Also: it is urgent." and "cache_control" in text


# ---------------------------------------------------------------- the scripted model


async def test_scripted_list_plays_in_order_then_runs_out():
    model = ScriptedModel([Response(text="one"), ServerError("flaky"), Response(text="two")])
    assert (await model.stream(ask("a"))).text == "one"
    with pytest.raises(ServerError):
        await model.stream(ask("b"))
    assert (await model.stream(ask("c"))).text == "two"
    with pytest.raises(RequestError, match="script exhausted"):
        await model.stream(ask("d"))
    assert [r.messages[-1].content for r in model.requests] == ["a", "b", "c", "d"]


async def test_scripted_chunks_and_estimates_usage():
    rec = Recorder()
    response = await ScriptedModel([Response(text="x" * 20)]).stream(ask("y" * 40), rec.on_text)
    assert rec.deltas == ["x" * 8, "x" * 8, "x" * 4]
    assert response.usage.output_tokens == 5 and response.usage.input_tokens >= 10
    assert response.model == "scripted"
    given = Usage(input_tokens=3, output_tokens=2)
    model = ScriptedModel([Response(text="hello", usage=given)], chunk_chars=2, delay=0.01)
    response = await model.stream(ask(), rec.on_text)
    assert response.usage == given and rec.deltas[-3:] == ["he", "ll", "o"]


async def test_scripted_function_sync_and_async():
    async def answer(request):
        return Response(text=f"async {request.messages[-1].content}")

    assert (await ScriptedModel(answer).stream(ask("x"))).text == "async x"
    model = ScriptedModel(lambda r: Response(tool_calls=[ToolCall(id="1", name="todo")]))
    assert (await model.stream(ask())).stop_reason == "tool_calls"


@pytest.mark.parametrize("said, call", [
    ("What time is it?", ("current_time", {})),
    ("todo: buy milk", ("todo", {"action": "add", "item": "buy milk"})),
    ("Please add call the bank to my todo list.", ("todo", {"action": "add",
                                                            "item": "call the bank"})),
])
async def test_demo_model_calls_offered_tools(said, call):
    response = await demo_model().stream(ask(said, TOOLS))
    assert [(c.name, c.arguments) for c in response.tool_calls] == [call]


async def test_demo_model_summarises_results_and_otherwise_explains_itself():
    model = demo_model()
    plain = await model.stream(ask("What time is it?"))  # no tools offered
    assert not plain.tool_calls and "What time is it?" in plain.text
    assert "offline demo" in plain.text and "[llm]" in plain.text
    done = await model.stream(Request(model="", messages=HISTORY[1:4], tools=TOOLS))
    assert done.text == "Done: current_time: 09:30" and done.stop_reason == "stop"


# ---------------------------------------------------------------- retries


async def test_retries_give_up_after_max_attempts_reporting_every_attempt():
    model = ScriptedModel([ServerError("down")] * 3 + [Response(text="too late")])
    rec = Recorder()
    with pytest.raises(ServerError):
        await retrying(model, rec, max_attempts=3, rand=lambda: 1.0)
    assert rec.attempts == [ServerError] * 3 and rec.sleeps == [1.0, 2.0]
    assert [r[0] for r in rec.retries] == [1, 2] and model.remaining == 1


async def test_backoff_is_capped_and_long_retry_after_is_honoured_or_raised():
    model = ScriptedModel([StreamError("cut")] * 4 + [Response(text="ok")])
    rec = Recorder()
    await retrying(model, rec, base_delay=1.0, max_delay=3.0, rand=lambda: 1.0)
    assert rec.sleeps == [1.0, 2.0, 3.0, 3.0]
    model = ScriptedModel([RateLimited("slow down", retry_after=120.0), Response(text="ok")])
    rec = Recorder()
    assert (await retrying(model, rec, max_delay=60.0)).text == "ok" and rec.sleeps == [120.0]
    model = ScriptedModel([RateLimited("come back tomorrow", retry_after=86400.0)])
    rec = Recorder()
    with pytest.raises(RateLimited):
        await retrying(model, rec, max_delay=60.0)
    assert rec.sleeps == [] and rec.attempts == [RateLimited]


def test_retry_after_header_forms():
    assert retry_after({"Retry-After": "3"}) == 3.0
    assert retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert 25 < retry_after({"Retry-After": formatdate(time.time() + 30, usegmt=True)}) <= 30
    assert retry_after({"Retry-After": "soon"}) is None and retry_after({}) is None


# ---------------------------------------------------------------- choosing a client


async def test_explicit_providers_and_overrides(http):
    config = LLMConfig(provider="openai", model="m1", base_url="http://h:1/v1",
                       api_key_env="MY_KEY")
    client, banner = await make_client(config, env={"MY_KEY": "k"}, http=http)
    assert isinstance(client, OpenAIClient) and banner is None
    assert (client.model, client.base_url, client.api_key, client.api_key_env) == (
        "m1", "http://h:1/v1", "k", "MY_KEY")
    client, _ = await make_client(LLMConfig(provider="anthropic"),
                                  env={"ANTHROPIC_API_KEY": "a"}, http=http)
    assert isinstance(client, AnthropicClient) and client.model == "claude-sonnet-4-5"
    client, banner = await make_client(LLMConfig(provider="scripted"), env={}, http=http)
    assert isinstance(client, ScriptedModel) and banner is None


@pytest.mark.parametrize("env, kind, model", [
    ({"OPENAI_API_KEY": "o", "ANTHROPIC_API_KEY": "a"}, OpenAIClient, "gpt-4o-mini"),
    ({"ANTHROPIC_API_KEY": "a"}, AnthropicClient, "claude-sonnet-4-5"),
    ({}, ScriptedModel, "offline-demo"),
])
async def test_auto_detect_from_env(env, kind, model, http):
    client, banner = await make_client(LLMConfig(), env=env, http=http, probe_ollama=False)
    assert isinstance(client, kind) and client.model == model
    assert banner == (DEMO_BANNER if kind is ScriptedModel else None)


async def test_auto_detect_probes_ollama_and_talks_to_it(server, http):
    server.tags = ["llama3.2:latest", "qwen2.5:7b"]
    client, banner = await make_client(LLMConfig(), env={}, http=http, ollama_url=server.url)
    assert banner is None and (client.provider, client.model) == ("ollama", "llama3.2:latest")
    assert (await client.stream(ask())).text == "ok"
    assert server.requests[-1].path == "/v1/chat/completions"
    assert "authorization" not in server.requests[-1].headers
    server.tags = None  # not an Ollama: the demo model
    client, banner = await make_client(LLMConfig(), env={}, http=http, ollama_url=server.url)
    assert isinstance(client, ScriptedModel) and banner == DEMO_BANNER
