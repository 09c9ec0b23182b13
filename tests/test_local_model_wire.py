"""A local server's answers at the wire (llama.cpp's bodies, replayed by
tests/fakes/local_llm_server.py): what is request-caused and what an outage, arguments sent
back as JSON, the strictly alternating shape, and the OpenAI-compatible client repairing a
request the server refuses, over real HTTP."""

import json

import httpx
import pytest

from bot.llm.alternate import alternating
from bot.llm.base import dump_arguments
from bot.llm.errors import Loading, Rejected, RequestError, ServerError
from bot.llm.http_errors import status_error
from bot.llm.openai import OpenAIClient
from bot.llm.repair import Shape
from bot.llm.retry import stream_with_retries
from bot.llm.types import Message, Request, ToolCall, ToolSpec
from tests.fakes.local_llm_server import (
    LOADING,
    NO_IMAGES,
    ROLES,
    LocalLLMServer,
    Output,
    parse_failure,
)


def classified(status: int, body: dict):
    return status_error("openai", status, json.dumps(body), {}, "")


def test_what_names_the_request_is_no_outage():
    roles = classified(400, ROLES)
    parse = classified(500, parse_failure(12, '{"fact": "tea'))
    image = classified(500, NO_IMAGES)
    assert [(type(e), e.cause) for e in (roles, parse, image)] == [
        (Rejected, "roles"), (Rejected, "tool_call"), (Rejected, "image")]
    assert all(isinstance(e, RequestError) for e in (roles, parse, image))  # not retried
    # the same, in the words of a newer llama.cpp (common/chat.cpp)
    args = classified(400, {"error": {"code": 400, "type": "invalid_request_error",
                                      "message": "Failed to parse tool call arguments as "
                                                 "JSON: [json.exception.parse_error.101] "
                                                 "parse error at line 1, column 13"}})
    assert (type(args), args.cause) == (Rejected, "tool_call")
    # a real llama-server with Gemma 3's template and tools offered (recorded)
    gemma = classified(400, {"error": {"code": 400, "type": "invalid_request_error", "message": (
        "Unable to generate parser for this template. Automatic parser generation failed: \n"
        "------------\nWhile executing CallExpression at line 15, column 27 in source:\n..."
        "% 2 == 0) -%}\u21b5        {{ raise_exception(\"Conversation roles must alternate "
        "user...")}})
    assert (type(gemma), gemma.cause) == (Rejected, "roles")
    assert isinstance(classified(503, LOADING), Loading)
    # a 500 that names nothing is still an outage
    plain = classified(500, {"error": {"code": 500, "message": "CUDA error",
                                       "type": "server_error"}})
    assert type(plain) is ServerError


def test_arguments_that_were_no_json_go_back_as_an_empty_object():
    assert json.loads(dump_arguments({"_raw": '{"fact": "tea'})) == {}
    assert json.loads(dump_arguments({"fact": "tea"})) == {"fact": "tea"}


def conversation() -> list[Message]:
    return [
        Message(role="system", content="You are Steward."),
        Message(role="user", content="add milk"),
        Message(role="assistant", content="", tool_calls=[
            ToolCall(id="a", name="todo", arguments={"action": "add", "item": "milk"}),
            ToolCall(id="b", name="todo", arguments={"_raw": "{broken"})]),
        Message(role="tool", tool_call_id="a", name="todo", content="1. [ ] milk"),
        Message(role="tool", tool_call_id="b", name="todo", content="error: bad",
                is_error=True),
        Message(role="assistant", content="Added milk."),
        Message(role="user", content="and eggs"),
        Message(role="user", content="please"),
        Message(role="system", content="Possibly relevant: eggs were bought yesterday"),
        Message(role="user", content="thanks"),
    ]


def test_the_plain_shape_alternates_and_keeps_what_happened():
    shaped = alternating(conversation())
    roles = [m.role for m in shaped]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert all(not m.tool_calls and m.tool_call_id is None for m in shaped)
    called = shaped[2].content
    assert '[I called the tool todo with {"action": "add", "item": "milk"}]' in called
    assert "[I called the tool todo with {}]" in called  # never the broken text
    assert "[tool todo returned: 1. [ ] milk]" in shaped[3].content
    assert "[tool todo failed: error: bad]" in shaped[3].content
    # the recall note went into the user turn it stood before, the follow-ups merged
    assert shaped[5].content == ("and eggs\n\nplease\n\nPossibly relevant: eggs were bought "
                                 "yesterday\n\nthanks")


@pytest.fixture
async def http():
    async with httpx.AsyncClient(trust_env=False) as client:
        yield client


def request(messages: list[Message], tools: bool = True) -> Request:
    spec = ToolSpec(name="todo", description="to-dos", parameters={"type": "object"})
    return Request(model="gemma3", messages=messages, tools=[spec] if tools else [])


async def test_a_strict_template_is_learned_once_per_model(http):
    with LocalLLMServer([Output("Done.")], strict_roles=True) as server:
        client = OpenAIClient(http, base_url=server.url, api_key=None, model="gemma3")
        first = await client.stream(request(conversation()))
        second = await client.stream(request(conversation()))
    assert (first.text, second.text) == ("Done.", "Done.")
    assert server.statuses == [400, 200, 200]  # refused once, then sent plain at once
    assert client.shapes == {"gemma3": Shape(plain=True)}
    assert [m["role"] for m in server.requests[1]["messages"]] == [
        "system", "user", "assistant", "user", "assistant", "user"]


async def test_a_history_the_server_cannot_parse_is_sent_plain(http):
    history = conversation()
    sent = OpenAIClient(http, base_url="http://x/v1", api_key=None,
                        model="m").wire_body(request(history))
    # what a server gets for the call the model garbled: JSON, not the broken text
    assert sent["messages"][2]["tool_calls"][1]["function"]["arguments"] == "{}"
    with LocalLLMServer([Output("Fine.")]) as server:
        client = OpenAIClient(http, base_url=server.url, api_key=None, model="gemma3")
        # a server that cannot parse even a well-formed call (say, its template's parser)
        server.answer = _refusing_tool_calls(server.answer)
        response = await stream_with_retries(client, request(history))
    assert response.text == "Fine."
    assert server.statuses == [500, 200]  # repaired at once, not retried as an outage


def _refusing_tool_calls(answer):
    def refuse(body):
        if any(m.get("tool_calls") for m in body["messages"]):
            return 500, parse_failure(0, "<tool_call>")
        return answer(body)
    return refuse


async def test_a_rejection_nothing_can_repair_is_raised_not_retried(http):
    with LocalLLMServer() as server:
        server.answer = lambda body: (500, parse_failure(0, "x"))
        client = OpenAIClient(http, base_url=server.url, api_key=None, model="gemma3")
        with pytest.raises(Rejected):
            await stream_with_retries(client, request(conversation()), base_delay=0.01)
    # as sent, then plain, then plain without tools: three requests, no outage retries
    assert len(server.statuses) == 3
    assert "tools" not in server.requests[-1]


class Restarting:
    """A client whose server is restarting: `fails` errors in turn, then an answer."""

    provider, model = "openai", "gemma3"

    def __init__(self, *fails, reached: bool = True):
        self.fails = list(fails)
        self.reached = reached
        self.calls = 0

    async def stream(self, request, on_text=None):
        from bot.llm.types import Response
        self.calls += 1
        if self.fails:
            raise self.fails.pop(0)
        return Response(text="back")


class Clock:
    def __init__(self):
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def loading() -> Loading:
    return classified(503, LOADING)


async def test_a_loading_server_is_waited_for_beyond_max_attempts():
    from bot.llm.errors import Unreachable
    clock = Clock()
    client = Restarting(Unreachable("refused"), *[loading() for _ in range(20)])
    response = await stream_with_retries(client, request(conversation()), max_attempts=5,
                                         base_delay=1.0, wait_for_server=300, clock=clock,
                                         sleep=clock.sleep)
    assert response.text == "back" and client.calls == 22
    assert max(clock.waits) <= 5.0  # polled often enough to answer soon after it is back


async def test_a_server_that_stays_down_is_given_up_on_after_the_wait():
    from bot.llm.errors import Unreachable
    clock = Clock()
    client = Restarting(*[Unreachable("refused") for _ in range(1000)])
    with pytest.raises(Unreachable):
        await stream_with_retries(client, request(conversation()), base_delay=1.0,
                                  wait_for_server=120, clock=clock, sleep=clock.sleep)
    assert 120 <= clock.now < 126 and clock.now == pytest.approx(sum(clock.waits))
    # never reached in this process (down at start): two quick tries, as before
    fresh = Restarting(*[Unreachable("refused") for _ in range(10)], reached=False)
    with pytest.raises(Unreachable):
        await stream_with_retries(fresh, request(conversation()), base_delay=1.0,
                                  wait_for_server=120, clock=clock, sleep=clock.sleep)
    assert fresh.calls == 2
