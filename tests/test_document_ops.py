"""Ops and drafts: the pure core of Steward's versioned JSON documents."""

import copy
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.documents.draft import Draft, StaleError, TrackedDict, TrackedList
from store.documents.ops import OpError, apply_op, apply_ops, check_json

# --- ops ------------------------------------------------------------------------------------


def test_set_creates_key_replaces_element_and_root():
    doc = {"a": 1, "todo": [1, 2]}
    assert apply_ops(doc, [{"op": "set", "path": ["b"], "value": {"c": [1]}}]) == {
        "a": 1,
        "todo": [1, 2],
        "b": {"c": [1]},
    }
    assert apply_ops(doc, [{"op": "set", "path": ["todo", 1], "value": 9}])["todo"] == [1, 9]
    assert apply_ops(doc, [{"op": "set", "path": [], "value": [3]}]) == [3]
    assert doc == {"a": 1, "todo": [1, 2]}


def test_delete_key_and_element():
    doc = {"a": 1, "todo": ["x", "y", "z"]}
    ops = [{"op": "delete", "path": ["a"]}, {"op": "delete", "path": ["todo", 1]}]
    assert apply_ops(doc, ops) == {"todo": ["x", "z"]}


def test_insert_at_start_middle_end():
    ops = [
        {"op": "insert", "path": ["l", 0], "value": "a"},
        {"op": "insert", "path": ["l", 2], "value": "c"},
        {"op": "insert", "path": ["l", 2], "value": "b"},
    ]
    assert apply_ops({"l": ["x"]}, ops) == {"l": ["a", "x", "b", "c"]}


def test_append_and_splice():
    ops = [
        {"op": "append", "path": ["l"], "value": {"t": 1}},
        {"op": "splice", "path": ["l"], "start": 1, "delete": 2, "items": ["p", "q", "r"]},
        {"op": "splice", "path": ["l"], "start": 6, "delete": 0, "items": ["end"]},
    ]
    assert apply_ops({"l": [0, 1, 2, 3]}, ops) == {"l": [0, "p", "q", "r", 3, {"t": 1}, "end"]}


def test_increment_int_and_float():
    ops = [
        {"op": "increment", "path": ["n"], "by": 2},
        {"op": "increment", "path": ["l", 0], "by": 0.5},
    ]
    assert apply_ops({"n": 1, "l": [1.0]}, ops) == {"n": 3, "l": [1.5]}


def test_apply_op_mutates_in_place_and_does_not_share_values():
    doc = {"a": []}
    value = {"x": [1]}
    op = {"op": "append", "path": ["a"], "value": value}
    assert apply_op(doc, op) is doc
    doc["a"][0]["x"].append(2)
    assert value == {"x": [1]}


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        ([{"op": "delete", "path": ["gone"]}], "op 0 (delete ['gone']): missing key 'gone'"),
        (
            [{"op": "set", "path": ["n"], "value": 1}, {"op": "delete", "path": ["todo", 7]}],
            "op 1 (delete ['todo', 7]): index 7 out of range",
        ),
        ([{"op": "insert", "path": ["todo", 3], "value": 1}], "op 0 (insert ['todo', 3]): index"),
        ([{"op": "increment", "path": ["name"], "by": 1}], "cannot increment str"),
        ([{"op": "move", "path": ["todo"]}], "op 0 (move ['todo']): unknown op"),
        ([{"op": "append", "path": ["name"], "value": 1}], "append needs a list, found str"),
        ([{"op": "set", "path": ["todo", "x"], "value": 1}], "cannot address list with 'x'"),
        ([{"op": "set", "path": ["x"]}], "missing 'value'"),
        ([{"op": "set", "path": "x", "value": 1}], "path must be a list"),
        ([{"op": "delete", "path": []}], "path must not be empty"),
        ([{"op": "increment", "path": ["n"], "by": True}], "finite number 'by'"),
        ([{"op": "increment", "path": ["big"], "by": 1.5}], "not a finite number"),
        ([{"op": "splice", "path": ["todo"], "start": 1, "delete": 2, "items": []}], "range"),
        (["set"], "op 0 ('set'): an op must be a dict"),
        ([{"op": "set", "path": ["x"], "value": {1, 2}}], "set at [] is not JSON"),
    ],
)
def test_op_errors_name_the_op(ops, message):
    doc = {"todo": ["a", "b"], "name": "steward", "n": 1, "big": 10**400}
    with pytest.raises(OpError) as caught:
        apply_ops(doc, ops)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_failed_op_leaves_value_untouched():
    doc = {"todo": [1, 2]}
    with pytest.raises(OpError):
        apply_op(doc, {"op": "splice", "path": ["todo"], "start": 1, "delete": 5, "items": [0]})
    assert doc == {"todo": [1, 2]}


@pytest.mark.parametrize(
    "value",
    [{1, 2}, float("nan"), float("inf"), {1: "a"}, {"a": [(1, 2)]}, {"a": b"x"}, object()],
)
def test_check_json_rejects_non_json(value):
    with pytest.raises(TypeError):
        check_json(value)


def test_check_json_names_the_path():
    with pytest.raises(TypeError, match=r"\['a', 1, 'b'\]"):
        check_json({"a": [0, {"b": float("nan")}]})


# --- draft ----------------------------------------------------------------------------------


def test_draft_records_ops_at_child_paths():
    doc = {"todo": [{"title": "milk", "tries": 0}]}
    draft = Draft(doc)
    draft.root["todo"].append({"title": "eggs"})
    draft.root["todo"][0].increment("tries")
    draft.root["todo"][-1]["done"] = True
    assert draft.ops == [
        {"op": "append", "path": ["todo"], "value": {"title": "eggs"}},
        {"op": "increment", "path": ["todo", 0, "tries"], "by": 1},
        {"op": "set", "path": ["todo", 1, "done"], "value": True},
    ]
    assert draft.changed
    assert apply_ops(doc, draft.ops) == draft.value
    assert doc == {"todo": [{"title": "milk", "tries": 0}]}


def test_draft_behaves_like_plain_containers():
    draft = Draft({"a": 1, "l": [1, {"b": 2}]})
    root = draft.root
    assert isinstance(root, TrackedDict) and isinstance(root["l"], TrackedList)
    assert root == {"a": 1, "l": [1, {"b": 2}]} and {"a": 1, "l": [1, {"b": 2}]} == root
    assert root["l"] == [1, {"b": 2}] and root["l"] != [1]
    assert len(root) == 2 and list(root) == ["a", "l"] and "a" in root and "z" not in root
    assert {"b": 2} in root["l"] and root["l"].index({"b": 2}) == 1
    assert repr(root) == repr({"a": 1, "l": [1, {"b": 2}]})
    assert root["l"][1:] == [{"b": 2}] and type(root["l"][1:][0]) is dict
    assert root.get("z", 5) == 5
    assert not draft.changed


def test_pop_sort_reverse_and_self_assignment():
    draft = Draft({"l": [3, 1, 2], "d": {"x": [1]}})
    root = draft.root
    assert root["d"].pop("x") == [1] and root["d"].pop("x", None) is None
    root["l"].sort()
    root["l"].reverse()
    root["l"] += [0]
    assert draft.ops[1:] == [
        {"op": "set", "path": ["l"], "value": [1, 2, 3]},
        {"op": "set", "path": ["l"], "value": [3, 2, 1]},
        {"op": "splice", "path": ["l"], "start": 3, "delete": 0, "items": [0]},
    ]


def test_assigning_a_wrapper_stores_a_copy():
    draft = Draft({"a": {"x": 1}})
    draft.root["b"] = draft.root["a"]
    draft.root["a"]["x"] = 2
    assert draft.value == {"a": {"x": 2}, "b": {"x": 1}}
    assert draft.ops[0] == {"op": "set", "path": ["b"], "value": {"x": 1}}


def test_recorded_values_are_copies_of_the_caller_value():
    draft = Draft({})
    item = {"tags": []}
    draft.root["item"] = item
    item["tags"].append("late")
    draft.root["item"]["tags"].append("x")
    assert draft.ops[0]["value"] == {"tags": []}
    assert draft.value == {"item": {"tags": ["x"]}}


def test_stale_wrapper_raises_instead_of_editing_the_wrong_element():
    draft = Draft({"todo": [{"n": 1}, {"n": 2}]})
    first = draft.root["todo"][0]
    draft.root["todo"].insert(0, {"n": 0})
    with pytest.raises(StaleError):
        first["n"] = 5
    assert draft.value == {"todo": [{"n": 0}, {"n": 1}, {"n": 2}]}


@pytest.mark.parametrize(
    "value", [{1, 2}, float("nan"), {1: "a"}, (1, 2), {"a": {"b": float("inf")}}]
)
def test_draft_rejects_non_json_values(value):
    draft = Draft({"l": []})
    with pytest.raises(TypeError):
        draft.root["x"] = value
    with pytest.raises(TypeError):
        draft.root["l"].append(value)
    with pytest.raises(TypeError):
        Draft({"x": value})
    assert draft.ops == [] and draft.value == {"l": []}


def test_draft_rejects_bad_roots_and_keys():
    with pytest.raises(TypeError):
        Draft("text")
    draft = Draft({"s": "x", "n": 1})
    with pytest.raises(TypeError):
        draft.root[1] = "a"
    with pytest.raises(TypeError):
        draft.root.increment("s")
    with pytest.raises(TypeError):
        draft.root.increment("n", float("nan"))
    with pytest.raises(KeyError):
        draft.root.increment("missing")
    with pytest.raises(NotImplementedError):
        Draft([1, 2, 3]).root[::2] = [0, 0]
    assert draft.ops == []


# --- property: a draft tracks plain Python edits exactly ------------------------------------

KEYS = st.sampled_from(["a", "b", "c", "todo", "n"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-1000, 1000)
    | st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=12,
)
ROOTS = st.dictionaries(KEYS, JSON, max_size=5) | st.lists(JSON, max_size=5)
NUMBERS = st.integers(-50, 50) | st.floats(-100, 100, allow_nan=False)


def containers(value, path=()):
    """Every (path, container) in value, root first."""
    yield path, value
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(item, dict | list):
            yield from containers(item, (*path, key))


def at(node, path):
    for step in path:
        node = node[step]
    return node


def is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool)


def sort_key(value):
    return json.dumps(value, sort_keys=True)


def dict_action(data, tracked, plain):
    """Apply one random dict mutation to both; return (name, result_tracked, result_plain)."""
    keys = list(plain)
    numeric = [k for k in keys if is_number(plain[k])]
    choices = ["set", "setdefault", "update", "clear"]
    if keys:
        choices += ["delete", "pop", "popitem", "pop_default"]
    if numeric:
        choices.append("increment")
    action = data.draw(st.sampled_from(choices), label="dict action")
    if action == "set":
        key, value = data.draw(KEYS), data.draw(JSON)
        tracked[key] = value
        plain[key] = copy.deepcopy(value)
    elif action == "setdefault":
        key, value = data.draw(KEYS), data.draw(JSON)
        return action, tracked.setdefault(key, value), plain.setdefault(key, copy.deepcopy(value))
    elif action == "update":
        other = data.draw(st.dictionaries(KEYS, JSON, max_size=3))
        tracked.update(other)
        plain.update(copy.deepcopy(other))
    elif action == "clear":
        tracked.clear()
        plain.clear()
    elif action == "delete":
        key = data.draw(st.sampled_from(keys))
        del tracked[key]
        del plain[key]
    elif action == "pop":
        key = data.draw(st.sampled_from(keys))
        return action, tracked.pop(key), plain.pop(key)
    elif action == "pop_default":
        key = data.draw(KEYS)
        return action, tracked.pop(key, "dflt"), plain.pop(key, "dflt")
    elif action == "popitem":
        return action, tracked.popitem(), plain.popitem()
    elif action == "increment":
        key, by = data.draw(st.sampled_from(numeric)), data.draw(NUMBERS)
        tracked.increment(key, by)
        plain[key] += by
    return action, None, None


def list_action(data, tracked, plain):
    """Apply one random list mutation to both; return (name, result_tracked, result_plain)."""
    size = len(plain)
    numeric = [i for i, v in enumerate(plain) if is_number(v)]
    choices = ["insert", "append", "extend", "iadd", "splice", "del_slice", "clear"]
    choices += ["sort", "reverse"]
    if size:
        choices += ["set", "delete", "pop", "pop_last", "remove"]
    if numeric:
        choices.append("increment")
    action = data.draw(st.sampled_from(choices), label="list action")
    anywhere = st.integers(-size - 2, size + 2)
    if action == "insert":
        index, value = data.draw(anywhere), data.draw(JSON)
        tracked.insert(index, value)
        plain.insert(index, copy.deepcopy(value))
    elif action == "append":
        value = data.draw(JSON)
        tracked.append(value)
        plain.append(copy.deepcopy(value))
    elif action in ("extend", "iadd"):
        values = data.draw(st.lists(JSON, max_size=3))
        if action == "extend":
            tracked.extend(values)
        else:
            tracked += values
        plain.extend(copy.deepcopy(values))
    elif action == "splice":
        start, stop = data.draw(anywhere), data.draw(anywhere)
        values = data.draw(st.lists(JSON, max_size=3))
        tracked[start:stop] = values
        plain[start:stop] = copy.deepcopy(values)
    elif action == "del_slice":
        start, stop = data.draw(anywhere), data.draw(anywhere)
        del tracked[start:stop]
        del plain[start:stop]
    elif action == "clear":
        tracked.clear()
        plain.clear()
    elif action == "sort":
        reverse = data.draw(st.booleans())
        tracked.sort(key=sort_key, reverse=reverse)
        plain.sort(key=sort_key, reverse=reverse)
    elif action == "reverse":
        tracked.reverse()
        plain.reverse()
    elif action == "set":
        index, value = data.draw(st.integers(-size, size - 1)), data.draw(JSON)
        tracked[index] = value
        plain[index] = copy.deepcopy(value)
    elif action == "delete":
        index = data.draw(st.integers(-size, size - 1))
        del tracked[index]
        del plain[index]
    elif action == "pop":
        index = data.draw(st.integers(-size, size - 1))
        return action, tracked.pop(index), plain.pop(index)
    elif action == "pop_last":
        return action, tracked.pop(), plain.pop()
    elif action == "remove":
        value = copy.deepcopy(data.draw(st.sampled_from(plain)))
        tracked.remove(value)
        plain.remove(value)
    elif action == "increment":
        index, by = data.draw(st.sampled_from(numeric)), data.draw(NUMBERS)
        if data.draw(st.booleans()):
            index -= size
        tracked.increment(index, by)
        plain[index] += by
    return action, None, None


def copy_action(data, draft, plain):
    """Assign one container (as a tracked wrapper) into another; both sides copy."""
    paths = [path for path, _ in containers(plain)]
    source, target = data.draw(st.sampled_from(paths)), data.draw(st.sampled_from(paths))
    node = at(plain, target)
    if isinstance(node, dict):
        key = data.draw(KEYS)
        at(draft.root, target)[key] = at(draft.root, source)
        node[key] = copy.deepcopy(at(plain, source))
    elif node:
        index = data.draw(st.integers(0, len(node) - 1))
        at(draft.root, target)[index] = at(draft.root, source)
        node[index] = copy.deepcopy(at(plain, source))
    return "copy", None, None


@settings(max_examples=300, deadline=None)
@given(initial=ROOTS, data=st.data())
def test_draft_ops_replay_to_the_same_value_as_plain_edits(initial, data):
    pristine = copy.deepcopy(initial)
    draft = Draft(initial)
    plain = copy.deepcopy(initial)
    for _ in range(data.draw(st.integers(0, 25), label="steps")):
        if data.draw(st.integers(0, 9)) == 0:
            action, got, expected = copy_action(data, draft, plain)
        else:
            path = data.draw(st.sampled_from([p for p, _ in containers(plain)]), label="path")
            tracked, node = at(draft.root, path), at(plain, path)
            act = dict_action if isinstance(node, dict) else list_action
            action, got, expected = act(data, tracked, node)
        assert got == expected, action
        assert draft.value == plain, action
        assert draft.root == plain
    assert initial == pristine
    assert apply_ops(initial, draft.ops) == plain
    assert initial == pristine
    assert draft.changed == bool(draft.ops)
    wire = json.loads(json.dumps(draft.ops, allow_nan=False))
    assert wire == draft.ops
    assert apply_ops(initial, wire) == plain


def test_ops_are_independent_of_later_draft_edits():
    draft = Draft({"l": []})
    draft.root["l"].append({"x": [1]})
    before = copy.deepcopy(draft.ops)
    draft.root["l"][0]["x"].append(2)
    assert draft.ops[0] == before[0]
    assert apply_ops({"l": []}, draft.ops) == draft.value


def test_nan_never_reaches_ops():
    draft = Draft([1.5])
    with pytest.raises(TypeError):
        draft.root[0] = math.nan
    assert draft.ops == []
