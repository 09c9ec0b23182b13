"""Lists whose items keep their number: the to-do list, the long-term facts.

The model calls several tools at once ("remove 1, 2, 3 and 4"), and each call names the
items by the numbers it was shown. A position would shift as soon as one of those calls
lands, so every item carries an `id` that stays with it and is never given again: the
document keeps `next_id`, one above every id ever given. The model is shown the id as
the item's number ("7. [ ] buy milk").

Documents written before ids existed get them on their first edit, deterministically: the
items without a (valid, unique) id are numbered in list order from `next_id` (or from
one above the largest id), so an old list's items keep the numbers (positions) the model
was shown before. A read-only view numbers them the same way (`with_ids`) without
writing anything.
"""

from __future__ import annotations

import json
from typing import Any

from store.documents import Draft
from store.documents.draft import TrackedDict

__all__ = ["ensure_ids", "find_index", "numbers_hint", "take_id", "with_ids"]


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def ensure_ids(root: TrackedDict, key: str = "items") -> None:
    """Give every item of `root[key]` that has no id (or a duplicate one) the next free
    id, in list order, and keep `root["next_id"]` above every id given. Records ops only
    when something was missing, so a document that has its ids is left as it is. An item
    that is not an object becomes one: `{"text": <its text>}`."""
    items = root[key]
    plain = items[:]  # a plain copy
    ids = [i["id"] for i in plain if isinstance(i, dict) and _is_id(i.get("id"))]
    next_id = root.get("next_id")
    next_id = max(next_id if _is_id(next_id) else 1, max(ids, default=0) + 1)
    seen: set[int] = set()
    for index, item in enumerate(plain):
        if not isinstance(item, dict):
            text = item if isinstance(item, str) else json.dumps(item, ensure_ascii=False)
            items[index] = {"id": next_id, "text": text}
        elif _is_id(item.get("id")) and item["id"] not in seen:
            seen.add(item["id"])
            continue
        else:
            items[index]["id"] = next_id
        seen.add(next_id)
        next_id += 1
    if root.get("next_id") != next_id:
        root["next_id"] = next_id


def take_id(root: TrackedDict) -> int:
    """A new id, never given before (after `ensure_ids`)."""
    ident = root["next_id"]
    root.increment("next_id")
    return ident


def with_ids(value: dict, key: str = "items") -> dict:
    """`value` as its first edit would number it (nothing is written)."""
    draft = Draft(value)
    if not isinstance(value.get(key), list):
        draft.root[key] = []
    ensure_ids(draft.root, key)
    return draft.value


def find_index(items: list[dict], ident: int) -> int | None:
    """The position of the item with id `ident` in a plain list, or None."""
    for index, item in enumerate(items):
        if isinstance(item, dict) and item.get("id") == ident:
            return index
    return None


def numbers_hint(items: list[dict], noun: str) -> str:
    """`the item numbers are 2, 5, 7` (for an error about a number that is not there)."""
    ids = [str(i["id"]) for i in items if isinstance(i, dict) and "id" in i]
    if not ids:
        return f"there are no {noun}s"
    shown = ", ".join(ids[:30]) + (f" and {len(ids) - 30} more" if len(ids) > 30 else "")
    return f"the {noun} number{'s are' if len(ids) > 1 else ' is'} {shown}"
