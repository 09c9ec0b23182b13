"""Ops: the small JSON edits a Steward document's history is made of.

An op is a JSON-serialisable dict. A path is a list of steps: ``str`` keys into dicts,
``int`` indexes (0 <= i < len) into lists.

    {"op": "set", "path": p, "value": v}           dict key (created) or existing list index;
                                                   ``p == []`` replaces the root
    {"op": "delete", "path": p}                    dict key or list index; ``p`` non-empty
    {"op": "insert", "path": p + [i], "value": v}  list insert, 0 <= i <= len
    {"op": "append", "path": p, "value": v}        ``p`` is a list
    {"op": "splice", "path": p, "start": i, "delete": n, "items": [...]}
                                                   list[i:i+n] = items, 0 <= i <= i+n <= len
    {"op": "increment", "path": p, "by": n}        ``p`` is an int or float (not a bool)

``apply_ops`` replays ops on a copy of a value; an op that does not apply raises ``OpError``,
whose message names the op, e.g. ``op 3 (delete ['todo', 7]): index 7 out of range (len 2)``.
Every op is checked before it changes anything, so a failed op leaves the value untouched.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from store.errors import DocumentError

__all__ = ["OP_NAMES", "OpError", "apply_op", "apply_ops", "check_json", "copy_json"]


class OpError(DocumentError, ValueError):
    """An op that does not apply to the value it was given (or is malformed)."""

    def __init__(self, op: Any, reason: str, index: int | None = None):
        self.op = op
        self.reason = reason
        self.index = index
        label = _describe(op)
        if index is not None:
            label = f"op {index} ({label})"
        super().__init__(f"{label}: {reason}")


def check_json(value: Any) -> None:
    """Raise TypeError unless ``value`` is JSON: str, int, finite float, bool, None, and
    lists and str-keyed dicts of those."""
    _check(value, [])


def copy_json(value: Any) -> Any:
    """Deep-copy a JSON value (faster than ``copy.deepcopy``; dicts and lists become plain)."""
    if isinstance(value, dict):
        return {key: copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_json(item) for item in value]
    return value


def apply_ops(value: Any, ops: Iterable[dict]) -> Any:
    """Apply ``ops`` in order to a copy of ``value`` and return the result."""
    check_json(value)
    result = copy_json(value)
    for index, op in enumerate(ops):
        try:
            result = apply_op(result, op)
        except OpError as error:
            raise OpError(op, error.reason, index) from None
    return result


def apply_op(value: Any, op: dict) -> Any:
    """Apply one op to ``value`` in place; return the value (a new one for a root ``set``)."""
    if not isinstance(op, dict):
        raise OpError(op, "an op must be a dict")
    name = op.get("op")
    handler = _HANDLERS.get(name) if isinstance(name, str) else None
    if handler is None:
        raise OpError(op, "unknown op")
    path = op.get("path")
    if not isinstance(path, list) or not all(isinstance(s, str) or _is_int(s) for s in path):
        raise OpError(op, "path must be a list of str keys and int indexes")
    return handler(value, op, path)


def _set(root: Any, op: dict, path: list) -> Any:
    new = _field_value(op, "value")
    if not path:
        return new
    parent, key = _slot(root, op, path)
    if isinstance(parent, list):
        _check_index(op, parent, key)
    parent[key] = new
    return root


def _delete(root: Any, op: dict, path: list) -> Any:
    parent, key = _slot(root, op, path)
    if isinstance(parent, list):
        _check_index(op, parent, key)
    elif key not in parent:
        raise OpError(op, f"missing key {key!r}")
    del parent[key]
    return root


def _insert(root: Any, op: dict, path: list) -> Any:
    parent, index = _slot(root, op, path)
    if not isinstance(parent, list):
        raise OpError(op, "insert needs a list")
    if not 0 <= index <= len(parent):
        raise OpError(op, f"index {index} out of range (len {len(parent)})")
    parent.insert(index, _field_value(op, "value"))
    return root


def _append(root: Any, op: dict, path: list) -> Any:
    target = _list_at(root, op, path)
    target.append(_field_value(op, "value"))
    return root


def _splice(root: Any, op: dict, path: list) -> Any:
    target = _list_at(root, op, path)
    start, count = op.get("start"), op.get("delete")
    if not _is_int(start) or not _is_int(count):
        raise OpError(op, "splice needs int 'start' and 'delete'")
    if not (0 <= start <= len(target) and 0 <= count <= len(target) - start):
        raise OpError(op, f"range [{start}:{start}+{count}] out of range (len {len(target)})")
    items = _field_value(op, "items")
    if not isinstance(items, list):
        raise OpError(op, "splice needs a list of 'items'")
    target[start : start + count] = items
    return root


def _increment(root: Any, op: dict, path: list) -> Any:
    by = op.get("by")
    if not _is_number(by):
        raise OpError(op, "increment needs a finite number 'by'")
    current = _walk(root, op, path)
    if not _is_number(current):
        raise OpError(op, f"cannot increment {type(current).__name__}")
    try:
        result = current + by
    except OverflowError:
        result = math.inf
    if isinstance(result, float) and not math.isfinite(result):
        raise OpError(op, "result is not a finite number")
    if not path:
        return result
    _walk(root, op, path[:-1])[path[-1]] = result
    return root


_HANDLERS: dict[str, Callable[[Any, dict, list], Any]] = {
    "set": _set,
    "delete": _delete,
    "insert": _insert,
    "append": _append,
    "splice": _splice,
    "increment": _increment,
}
OP_NAMES = frozenset(_HANDLERS)


def _walk(node: Any, op: dict, path: list) -> Any:
    for step in path:
        if isinstance(node, dict) and isinstance(step, str):
            if step not in node:
                raise OpError(op, f"missing key {step!r}")
        elif isinstance(node, list) and _is_int(step):
            _check_index(op, node, step)
        else:
            raise OpError(op, f"cannot step into {type(node).__name__} with {step!r}")
        node = node[step]
    return node


def _slot(root: Any, op: dict, path: list) -> tuple[Any, Any]:
    """The container and key/index that ``path`` ends in (the key need not exist yet)."""
    if not path:
        raise OpError(op, "path must not be empty")
    parent, key = _walk(root, op, path[:-1]), path[-1]
    if isinstance(parent, dict) and isinstance(key, str):
        return parent, key
    if isinstance(parent, list) and _is_int(key):
        return parent, key
    raise OpError(op, f"cannot address {type(parent).__name__} with {key!r}")


def _list_at(root: Any, op: dict, path: list) -> list:
    target = _walk(root, op, path)
    if not isinstance(target, list):
        raise OpError(op, f"{op['op']} needs a list, found {type(target).__name__}")
    return target


def _check_index(op: dict, items: list, index: int) -> None:
    if not 0 <= index < len(items):
        raise OpError(op, f"index {index} out of range (len {len(items)})")


def _field_value(op: dict, field: str) -> Any:
    """The op's value field, checked and copied (so the document never shares the op's)."""
    if field not in op:
        raise OpError(op, f"missing {field!r}")
    try:
        check_json(op[field])
    except TypeError as error:
        raise OpError(op, str(error)) from None
    return copy_json(op[field])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return _is_int(value)


def _describe(op: Any) -> str:
    if not isinstance(op, dict):
        return repr(op)[:60]
    return f"{op.get('op', '?')} {op.get('path', '?')!r}"


def _check(value: Any, path: list) -> None:
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{value!r} at {path!r} is not JSON (not a finite number)")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"key {key!r} at {path!r} is not JSON (not a str)")
            path.append(key)
            _check(item, path)
            path.pop()
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            path.append(index)
            _check(item, path)
            path.pop()
        return
    raise TypeError(f"{type(value).__name__} at {path!r} is not JSON")
