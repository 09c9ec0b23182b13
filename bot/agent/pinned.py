"""The request an llm_call sends, pinned in its inputs when the call is spawned, so that a
call cut off by a crash is sent again exactly (DESIGN: the pinned request).

It is pinned as one JSON text, which pydantic writes and reads in a pass each; the call
spawned and run in the same process sends the very object instead (`Pinned`)."""

from collections import OrderedDict

from bot.llm.types import Request


def pin(request: Request) -> dict:
    """The inputs of an llm_call that sends `request`: its JSON and its outline. (As a
    nested value it was dumped, encoded, decoded and validated piece by piece: ~10 ms a
    call for a long window.)"""
    text = request.model_dump_json()
    return {"request_json": text, "request_outline": {
        "model": request.model, "messages": len(request.messages),
        "tools": len(request.tools), "chars": len(text)}}


def pinned(inputs: dict) -> Request:
    text = inputs.get("request_json")
    if text is not None:
        return Request.model_validate_json(text)
    return Request.model_validate(inputs["request"])  # pinned by an earlier build


class Pinned:
    """Requests this process pinned for calls it has not run yet, by the call's task id.
    The call, run here, takes its own (parsing the text again cost ~4 ms for a long
    window); one run elsewhere, or after a restart, reads its inputs. A few only: one
    never taken (its step did not land, another worker ran it) is pushed out."""

    def __init__(self, keep: int = 8):
        self._keep = keep
        self._requests: OrderedDict[str, Request] = OrderedDict()

    def put(self, task_id: str, request: Request) -> None:
        self._requests[task_id] = request
        if len(self._requests) > self._keep:
            self._requests.popitem(last=False)

    def take(self, task_id: str, inputs: dict) -> Request:
        request = self._requests.pop(task_id, None)
        return request if request is not None else pinned(inputs)
