"""Provider-neutral LLM request and response types. Stored as JSON in task inputs and
results (`model_dump(mode="json")` / `model_validate`), so they stay plain data."""

from typing import Literal

from pydantic import BaseModel, Field


class ToolCall(BaseModel):
    id: str
    name: str
    # Parsed JSON arguments. Arguments the model sent that are not a JSON object arrive as
    # {"_raw": "<text>"} so the tool layer can report the error back to the model.
    arguments: dict = Field(default_factory=dict)


class Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
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
