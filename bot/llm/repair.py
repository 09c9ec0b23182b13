"""What to send instead when a server rejects a request for something in it.

A `Rejected` error (`bot.llm.http_errors`) names the part of the request a server could not
take. The request is sent again changed just so, one step at a time, until the server takes
it or nothing is left to change:

    roles      the plain, strictly alternating shape (`bot.llm.alternate`)
    tool_call  the plain shape (tool calls as text); then, for this request only, no tools
    image      the images left out, a line of text in their place

A shape that worked is remembered for the model by the client, in the process only: it is
a fact about the server's current template and model, which change whenever the owner
restarts the server with other ones; learning it again costs one refused request (the
server answers at once, nothing is generated).

`notes` are for the person, in words: what they sent that the model did not see.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .alternate import alternating
from .errors import Rejected
from .types import Message, Request

IMAGE_LEFT_OUT = "[an image was attached here; this model cannot see images]"
IMAGE_NOTE = ("(I could not look at the image you sent: the model I use does not take "
              "images, so I answered from your words alone.)")
TOOLS_NOTE = ("(The model server could not read the tool calls in this conversation, so "
              "this answer was written without tools: nothing was remembered, scheduled or "
              "looked up for it.)")


@dataclass(frozen=True)
class Shape:
    plain: bool = False  # alternating roles, text only
    images: bool = True  # images sent
    tools: bool = True  # tools offered

    def remembered(self) -> Shape:
        """What is worth keeping for the model's later requests (tools are left out for
        one request only: the next may well take them)."""
        return replace(self, tools=True)


def shaped(request: Request, shape: Shape) -> tuple[Request, list[str]]:
    """`request` in `shape`, and the notes for the person it calls for."""
    if shape == Shape():
        return request, []
    messages, notes = list(request.messages), []
    if not shape.images and any(m.images for m in messages):
        newest = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        if newest >= 0 and messages[newest].images:
            notes.append(IMAGE_NOTE)  # said for the message that brought it, not later ones
        messages = [_without_images(m) for m in messages]
    if shape.plain:
        messages = alternating(messages)
    if not shape.tools and request.tools:
        notes.append(TOOLS_NOTE)
    update = {"messages": messages, **({} if shape.tools else {"tools": []})}
    return request.model_copy(update=update), notes


def repaired(shape: Shape, error: Rejected, request: Request) -> Shape | None:
    """The next shape to try after `error`, or None: nothing left that could help."""
    if error.cause == "image":
        has_images = any(m.images for m in request.messages)
        return replace(shape, images=False) if shape.images and has_images else None
    if not shape.plain:
        return replace(shape, plain=True)
    if error.cause == "tool_call" and shape.tools and request.tools:
        return replace(shape, tools=False)
    return None


def _without_images(m: Message) -> Message:
    if not m.images:
        return m
    lines = "\n".join(IMAGE_LEFT_OUT for _ in m.images)
    content = f"{m.content}\n\n{lines}" if m.content else lines
    return m.model_copy(update={"content": content, "images": []})
