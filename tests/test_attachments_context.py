"""Images in the context: the newest few go with their messages as image parts, older ones
are their notes, they count towards the window budget, the pinned request holds refs and
not bytes, and both model clients send them in their wire format to the fake provider over
real HTTP (which checks them as the providers do)."""

import base64
import json

import httpx
import pytest

from bot.agent.context import build_request, request_chars
from bot.agent_port import LocalPort
from bot.app.config import build_config
from bot.app.wiring import host_of, wire
from bot.llm.anthropic import AnthropicClient
from bot.llm.openai import OpenAIClient
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Request, Response
from bot.port import REF
from bot.tools import ToolBox
from tests.fakes.llm_server import FakeLLMServer, images
from tests.test_attachments import jpeg, png

KEY = "cli:pictures"


@pytest.fixture
async def port(store, tmp_path):
    """The port a connector is handed, from the real wiring."""
    async with httpx.AsyncClient() as http:
        app = wire(build_config({}, home=tmp_path), store,
                   ScriptedModel([Response(text="ok")]), http, toolbox=ToolBox())
        yield host_of(app.config, app.deps).port


async def say(port: LocalPort, n: int, text: str, *files: tuple[str, bytes, str]) -> list:
    refs, notes = [], []
    for name, data, media_type in files:
        kept = await port.keep(data, name=name, media_type=media_type)
        refs.append(kept.ref)
        notes.append(kept.text)
    await port.submit(channel="cli", external_ids=[f"m{n}"], conversation_key=KEY,
                      text="\n\n".join([text, *notes]), author="you",
                      data={REF: refs} if refs else None)
    return refs


async def request_for(port: LocalPort, tmp_path, **config) -> Request:
    conversation = await port.conversation(KEY)
    settings = build_config(config, home=tmp_path)
    return (await build_request(port._store, settings, conversation.id, tools=[],
                                model="m")).request


def users(request: Request):
    return [m for m in request.messages if m.role == "user"]


async def test_the_newest_images_are_shown_and_older_ones_are_notes(port, tmp_path):
    refs = []
    for n in range(6):
        refs += await say(port, n, f"picture {n}", (f"p{n}.png", png(200 + n, 100), "image/png"))
    request = await request_for(port, tmp_path)
    said = users(request)
    assert [len(m.images) for m in said] == [0, 0, 1, 1, 1, 1]
    assert [m.images[0].sha256 for m in said[2:]] == [r["blob"] for r in refs[2:]]
    assert said[0].content.startswith("picture 0\n\n[image: p0.png (image/png, ")
    assert said[0].content.endswith("[1 image of this message not shown again: only the "
                                    "newest 4 are]")
    assert "not shown again" not in said[-1].content
    # the pinned request names the blobs; it never carries their bytes
    pinned = json.dumps(request.model_dump(mode="json"))
    assert len(pinned) < 10_000 and refs[-1]["blob"] in pinned
    assert request_chars(request) >= sum(i.chars for m in said for i in m.images)


async def test_images_are_not_shown_to_a_model_without_vision(port, tmp_path):
    await say(port, 1, "look", ("a.jpg", jpeg(300, 200), "image/jpeg"))
    [message] = users(await request_for(port, tmp_path, attachments={"send_images": False}))
    assert message.images == []
    assert message.content.endswith("[images are not shown to this model: only their notes "
                                    "are]")


async def test_images_count_towards_the_window(port, tmp_path):
    for n in range(12):
        await say(port, n, f"message {n} " + "words " * 80)
    await say(port, 99, "and these", *[(f"i{k}.png", png(300 + k, 300), "image/png")
                                       for k in range(4)])
    small = {"llm": {"context_window": 4000, "max_output_tokens": 3000}}
    text_only = users(await request_for(port, tmp_path, **small,
                                        attachments={"send_images": False}))
    pictured = users(await request_for(port, tmp_path, **small))
    assert pictured[-1].content.startswith("and these")
    shown = pictured[-1].images
    assert 1 <= len(shown) < 4  # at most half the budget goes to images
    assert pictured[-1].content.endswith(
        f"[{4 - len(shown)} image{'s' if 4 - len(shown) > 1 else ''} of this message not "
        "shown again: only the newest 4 are]")
    assert len(pictured) < len(text_only)  # older text gave way to the images


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_the_clients_send_image_blocks(port, tmp_path, wire):
    first = await say(port, 1, "what is this?", ("cat.jpg", jpeg(2000, 1500), "image/jpeg"),
                      ("plan.png", png(640, 480), "image/png"))
    request = await request_for(port, tmp_path)
    with FakeLLMServer() as server:
        http = httpx.AsyncClient()
        if wire == "openai":
            client = OpenAIClient(http, base_url=server.url + "/v1", api_key="k", model="m")
        else:
            client = AnthropicClient(http, base_url=server.url, api_key="k", model="m")
        try:
            assert (await client.stream(request)).text == "ok"
        finally:
            await http.aclose()
        [recorded] = server.requests
    sent = images(recorded)
    blobs = tmp_path / "blobs"
    assert sent == [(r["media_type"], (blobs / r["blob"][:2] / r["blob"]).read_bytes())
                    for r in first]
    user = recorded.body["messages"][-1]
    text = user["content"][0]["text"]
    assert user["role"] == "user" and text.startswith("what is this?\n\n[image: cat.jpg")
    assert [p["type"] for p in user["content"]] == (
        ["text", "image_url", "image_url"] if wire == "openai" else ["text", "image", "image"])


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
async def test_a_lost_blob_is_said_in_text_and_the_call_goes_on(port, tmp_path, wire):
    [ref] = await say(port, 1, "this one", ("gone.png", png(100, 100), "image/png"))
    (tmp_path / "blobs" / ref["blob"][:2] / ref["blob"]).unlink()
    request = await request_for(port, tmp_path)
    with FakeLLMServer() as server:
        http = httpx.AsyncClient()
        client = (OpenAIClient(http, base_url=server.url + "/v1", api_key="k", model="m")
                  if wire == "openai" else
                  AnthropicClient(http, base_url=server.url, api_key="k", model="m"))
        try:
            assert (await client.stream(request)).text == "ok"
        finally:
            await http.aclose()
        [recorded] = server.requests
    assert images(recorded) == []
    assert "[the image gone.png could not be read from its stored copy]" in json.dumps(
        recorded.body, ensure_ascii=False)


async def test_the_fake_provider_refuses_a_bad_image_block():
    png_bytes = png(10, 10)
    with FakeLLMServer() as server:
        http = httpx.AsyncClient()
        try:
            for media_type, data in (("image/jpeg", png_bytes), ("image/png", b"not png")):
                url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
                body = {"model": "m", "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": url}}]}]}
                answer = await http.post(server.url + "/v1/chat/completions", json=body)
                assert answer.status_code == 400 and "is not" in answer.text
        finally:
            await http.aclose()
