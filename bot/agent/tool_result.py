"""What the model is told about a finished tool task, read the same way by the turn (after
its tools) and by an approval (the call it ran once the person said yes)."""

from store import DONE, INTERRUPTED, Task

INTERRUPTED_NOTE = ("error: this tool call was interrupted (Steward stopped while it ran) and "
                    "was not repeated, because it may already have taken effect.")


def tool_outcome(task: Task) -> tuple[str, bool]:
    """What the model is told about a finished tool task."""
    if task.state == DONE and isinstance(task.result, dict) and "content" in task.result:
        return task.result["content"], bool(task.result.get("is_error"))
    if task.state == INTERRUPTED:
        partial = (task.result or {}).get("partial")
        return INTERRUPTED_NOTE + (f" Partial output: {partial}" if partial else ""), True
    return f"error: the tool call failed: {task.error or task.state}", True
