"""Provider-neutral LLM request and response types. Stored as JSON in task inputs and
results (`model_dump(mode="json")` / `model_validate`), so they stay plain data.

An image in a message is a reference to a file in the home's blob store, never its bytes:
a pinned request stays small, and the client reads the file (`image_data`) only when it
sends."""

import asyncio
import base64
import hashlib
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

IMAGE_CHARS_PER_TOKEN = 3  # an image's size in a request, as the characters it is worth


class ToolCall(BaseModel):
    id: str
    name: str
    # Parsed JSON arguments. Arguments the model sent that are not a JSON object arrive as
    # {"_raw": "<text>"} so the tool layer can report the error back to the model.
    arguments: dict = Field(default_factory=dict)


class Image(BaseModel):
    """An image shown with a user message: the blob `sha256` at `path`."""

    media_type: str  # "image/png" or "image/jpeg"
    sha256: str
    path: str
    name: str = ""
    width: int = 0
    height: int = 0

    @property
    def tokens(self) -> int:
        """About what a provider counts for it (Anthropic's w×h/750; OpenAI's tiles are
        close for the sizes Steward sends)."""
        return max(85, math.ceil(self.width * self.height / 750))

    @property
    def chars(self) -> int:
        return self.tokens * IMAGE_CHARS_PER_TOKEN


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[Image] = Field(default_factory=list)  # user only
    tool_calls: list[ToolCall] = Field(default_factory=list)  # assistant only
    tool_call_id: str | None = None  # tool only: which call this answers
    name: str | None = None  # tool only: the tool's name
    is_error: bool = False  # tool only: the result is an error


class ToolSpec(BaseModel):
    name: str
    description: str
    parameters: dict  # JSON schema of the arguments object


class Request(BaseModel):
    model: str
    messages: list[Message]  # a leading role="system" message is the system prompt
    tools: list[ToolSpec] = Field(default_factory=list)
    max_tokens: int = 4096
    temperature: float | None = None


class Usage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float | None = None  # when the provider says what the call cost (OpenRouter)


class Response(BaseModel):
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    # "stop" (final answer), "tool_calls", "length" (max_tokens hit), or the provider's own
    stop_reason: str = "stop"
    model: str = ""
    # What the person should hear about how this answer was got, in words: the client had
    # to change the request for the server to take it (an image it cannot read, left out).
    notes: list[str] = Field(default_factory=list)


async def image_data(request: Request) -> dict[str, str | None]:
    """The base64 of every image the request shows, by sha256, read in a thread; None for
    one whose file is missing or no longer matches its hash (the client then says so in
    text instead of failing the call)."""
    wanted = {i.sha256: i.path for m in request.messages for i in m.images}
    if not wanted:
        return {}
    return await asyncio.to_thread(lambda: {sha: _read(path, sha) for sha, path in wanted.items()})


def _read(path: str, sha256: str) -> str | None:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != sha256:
        return None
    return base64.b64encode(data).decode("ascii")


def missing_image(image: Image) -> str:
    return f"[the image {image.name or image.sha256[:12]} could not be read from its stored copy]"
