"""Draft: edit a JSON document like a plain dict or list while recording ops.

    draft = Draft({"todo": []})
    draft.root["todo"].append({"title": "milk", "tries": 0})
    draft.root["todo"][0].increment("tries")
    draft.ops  # [{"op": "append", "path": ["todo"], ...}, {"op": "increment", ...}]

Every mutation is turned into an op and applied with ``ops.apply_op``, so replaying
``draft.ops`` on the original value gives ``draft.value`` by construction (sort and reverse
work in place and record one ``set`` of the whole list).

Reading a nested dict or list gives a ``TrackedDict``/``TrackedList`` bound to that child's
path. If the child later moves or goes away (an insert before it, a sort, a delete, a
reassignment), using the old wrapper raises ``StaleError`` instead of editing whatever now
sits at that path. Values stored are checked with ``check_json`` and deep-copied (a wrapper
stores a copy of its plain value); values taken out (``pop``, slices) are plain.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Iterable, Iterator, MutableMapping, MutableSequence
from typing import Any

from store.documents.ops import apply_op, check_json, copy_json
from store.errors import DocumentError

__all__ = ["Draft", "StaleError", "TrackedDict", "TrackedList"]

_MISSING = object()


class StaleError(DocumentError, RuntimeError):
    """A tracked wrapper whose dict or list was moved or removed from the draft."""


class Draft:
    """A working copy of a document plus the ops that turned the original into it."""

    def __init__(self, value: dict | list):
        if not isinstance(value, dict | list):
            raise TypeError(f"a document root must be a dict or list, not {type(value).__name__}")
        check_json(value)
        self._value = copy_json(value)
        self.ops: list[dict] = []
        self.root: TrackedDict | TrackedList = _wrap(self, (), self._value)

    @property
    def value(self) -> dict | list:
        """A deep copy of the current plain value."""
        return copy_json(self._value)

    @property
    def changed(self) -> bool:
        return bool(self.ops)

    def _apply(self, op: dict) -> None:
        self._value = apply_op(self._value, op)
        self.ops.append(op)

    def __repr__(self) -> str:
        return f"Draft({self._value!r}, ops={len(self.ops)})"


class _Tracked:
    __slots__ = ("_draft", "_path", "_target")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, draft: Draft, path: tuple, target: dict | list):
        self._draft = draft
        self._path = path
        self._target = target

    @property
    def _data(self) -> Any:
        node = self._draft._value
        try:
            for step in self._path:
                node = node[step]
        except (KeyError, IndexError, TypeError):
            node = None
        if node is not self._target:
            raise StaleError(f"the value read at {list(self._path)!r} was moved or removed")
        return node

    def _at(self, key: str | int) -> list:
        return [*self._path, key]

    def _child(self, key: str | int, value: Any) -> Any:
        return _wrap(self._draft, (*self._path, key), value)

    def _is_itself(self, current: Any, value: Any) -> bool:
        """``value`` is a wrapper of the very object being replaced (as in ``d[k] += [x]``)."""
        return isinstance(value, _Tracked) and value._target is current

    def _increment(self, data: Any, key: str | int, by: int | float) -> Any:
        current = data[key]
        for name, number in (("the value", current), ("by", by)):
            if isinstance(number, bool) or not isinstance(number, int | float):
                raise TypeError(f"cannot increment: {name} is a {type(number).__name__}")
        check_json(by)
        self._draft._apply({"op": "increment", "path": self._at(key), "by": by})
        return self._data[key]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Tracked):
            other = other._data
        return self._data == other

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return repr(self._data)


class TrackedDict(_Tracked, MutableMapping):
    """A dict inside a ``Draft``; mutations record ops."""

    __slots__ = ()

    def __getitem__(self, key: str) -> Any:
        return self._child(key, self._data[key])

    def __setitem__(self, key: str, value: Any) -> None:
        data = self._data
        if not isinstance(key, str):
            raise TypeError(f"document keys must be str, not {type(key).__name__}")
        if self._is_itself(data.get(key), value):
            return
        self._draft._apply({"op": "set", "path": self._at(key), "value": _plain(value)})

    def __delitem__(self, key: str) -> None:
        if key not in self._data:
            raise KeyError(key)
        self._draft._apply({"op": "delete", "path": self._at(key)})

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def pop(self, key: str, default: Any = _MISSING) -> Any:
        data = self._data
        if key not in data:
            if default is _MISSING:
                raise KeyError(key)
            return default
        value = data[key]
        del self[key]
        return value

    def popitem(self) -> tuple[str, Any]:
        data = self._data
        if not data:
            raise KeyError("popitem(): dictionary is empty")
        key = next(reversed(data))
        return key, self.pop(key)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self._data:
            self[key] = default
        return self[key]

    def clear(self) -> None:
        for key in list(self._data):
            del self[key]

    def increment(self, key: str, by: int | float = 1) -> int | float:
        """Add ``by`` to the number at ``key``, recording an ``increment`` op."""
        return self._increment(self._data, key, by)


class TrackedList(_Tracked, MutableSequence):
    """A list inside a ``Draft``; mutations record ops."""

    __slots__ = ()

    def __getitem__(self, index: int | slice) -> Any:
        data = self._data
        if isinstance(index, slice):
            return copy_json(data[index])
        index = _index(index, len(data), "list index out of range")
        return self._child(index, data[index])

    def __setitem__(self, index: int | slice, value: Any) -> None:
        data = self._data
        if isinstance(index, slice):
            start, stop = _span(index, len(data))
            items = [_plain(item) for item in value]
            if items or stop > start:
                self._splice(start, stop - start, items)
            return
        index = _index(index, len(data), "list assignment index out of range")
        if not self._is_itself(data[index], value):
            self._draft._apply({"op": "set", "path": self._at(index), "value": _plain(value)})

    def __delitem__(self, index: int | slice) -> None:
        data = self._data
        if isinstance(index, slice):
            start, stop = _span(index, len(data))
            if stop > start:
                self._splice(start, stop - start, [])
            return
        index = _index(index, len(data), "list assignment index out of range")
        self._draft._apply({"op": "delete", "path": self._at(index)})

    def __iter__(self) -> Iterator[Any]:
        index = 0
        while index < len(self._data):
            yield self[index]
            index += 1

    def __contains__(self, value: object) -> bool:
        return value in self._data

    def insert(self, index: int, value: Any) -> None:
        size = len(self._data)
        index = operator.index(index)
        index = min(max(index + size if index < 0 else index, 0), size)
        self._draft._apply({"op": "insert", "path": self._at(int(index)), "value": _plain(value)})

    def append(self, value: Any) -> None:
        self._draft._apply({"op": "append", "path": list(self._path), "value": _plain(value)})

    def extend(self, values: Iterable[Any]) -> None:
        items = [_plain(item) for item in values]
        if items:
            self._splice(len(self._data), 0, items)

    def pop(self, index: int = -1) -> Any:
        data = self._data
        if not data:
            raise IndexError("pop from empty list")
        index = _index(index, len(data), "pop index out of range")
        value = data[index]
        del self[index]
        return value

    def remove(self, value: Any) -> None:
        del self[self._data.index(value)]

    def clear(self) -> None:
        if self._data:
            self._splice(0, len(self._data), [])

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        return self._data.index(value, start, sys.maxsize if stop is None else stop)

    def count(self, value: Any) -> int:
        return self._data.count(value)

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        """Sort in place (``key`` sees plain values); records one ``set`` of the list."""
        data = self._data
        data[:] = sorted(data, key=key, reverse=reverse)
        self._record_whole(data)

    def reverse(self) -> None:
        """Reverse in place; records one ``set`` of the list."""
        data = self._data
        data.reverse()
        self._record_whole(data)

    def increment(self, index: int, by: int | float = 1) -> int | float:
        """Add ``by`` to the number at ``index``, recording an ``increment`` op."""
        data = self._data
        index = _index(index, len(data), "list index out of range")
        return self._increment(data, index, by)

    def _splice(self, start: int, count: int, items: list) -> None:
        op = {"op": "splice", "path": list(self._path), "start": start, "delete": count}
        self._draft._apply({**op, "items": items})

    def _record_whole(self, data: list) -> None:
        # Already changed in place (so wrappers of the list stay valid): record, don't apply.
        op = {"op": "set", "path": list(self._path), "value": copy_json(data)}
        self._draft.ops.append(op)


def _wrap(draft: Draft, path: tuple, value: Any) -> Any:
    if isinstance(value, dict):
        return TrackedDict(draft, path, value)
    if isinstance(value, list):
        return TrackedList(draft, path, value)
    return value


def _plain(value: Any) -> Any:
    """A checked, deep-copied plain JSON value; wrappers (at any depth) become copies."""
    value = _unwrap(value)
    check_json(value)
    return value


def _unwrap(value: Any) -> Any:
    if isinstance(value, _Tracked):
        return copy_json(value._data)
    if isinstance(value, dict):
        return {key: _unwrap(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unwrap(item) for item in value]
    return value


def _index(index: Any, size: int, message: str) -> int:
    index = operator.index(index)
    if index < 0:
        index += size
    if not 0 <= index < size:
        raise IndexError(message)
    return int(index)


def _span(index: slice, size: int) -> tuple[int, int]:
    start, stop, step = index.indices(size)
    if step != 1:
        raise NotImplementedError("extended slices (step != 1) are not supported on documents")
    return start, max(start, stop)
