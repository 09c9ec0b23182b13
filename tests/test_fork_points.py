"""`steward fork --at N` never leaves a fork inside an exchange: a tool call without its
result, or a question without its answer. Such a fork once made the next turn loop (16 to-do
items, 16 calls): the new message was held behind the parent's unfinished turn, so the model
saw it as the last word at every step. Real `steward` subprocesses, the offline demo model."""

import json

import pytest

from bot.app.config import build_config
from bot.app.opened import opened_store
from tests.test_cli import steward


@pytest.fixture
def home(tmp_path):
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


async def _log(home, key: str) -> list[dict]:
    code, out, err = await steward(home, "log", key, "--json", "--limit", "200")
    assert code == 0, err
    return [json.loads(line) for line in out.splitlines()]


async def _a_tool_exchange(home) -> None:
    """Entries 1 (the question), 2 (the call), 3 (its result), 4 (the answer)."""
    code, out, err = await steward(home, "ask", "add buy milk to my todo")
    assert code == 0, err
    assert [r["kind"] for r in await _log(home, "cli:default")] == [
        "user", "assistant", "tool_result", "assistant"]


async def _answers_once(home, key: str) -> None:
    """The fork's next turn adds one item with one call and answers."""
    before = len(await _log(home, key))
    code, out, err = await steward(home, "ask", "--session", key, "add eggs to my todo")
    assert code == 0, err
    assert out.startswith("Done: todo:") and out.count("eggs") == 1, out
    new = (await _log(home, key))[before:]
    assert [r["kind"] for r in new] == ["user", "assistant", "tool_result", "assistant"], new


@pytest.mark.parametrize(("at", "safe", "why"), [
    (2, 4, "a tool call"),  # as far from 0 as from 4: the later keeps what was pointed at
    (3, 4, "a question"),  # the result is there, the answer is not
    (1, 0, "a question"),
])
async def test_a_fork_point_inside_an_exchange_moves_to_the_nearest_safe_one(
        home, at, safe, why):
    await _a_tool_exchange(home)
    code, out, err = await steward(home, "fork", "cli:default", "--at", str(at))
    assert (code, out.strip()) == (0, f"cli:default@{safe}"), err
    assert f"entry {at} is inside an exchange ({why}" in err and f"forked at {safe}" in err, err
    await _answers_once(home, f"cli:default@{safe}")


async def test_a_safe_fork_point_is_taken_as_given_without_a_word(home):
    await _a_tool_exchange(home)
    code, out, err = await steward(home, "fork", "cli:default", "--at", "4", "--as", "cli:b")
    assert (code, out, err) == (0, "cli:b\n", "")
    code, out, err = await steward(home, "fork", "cli:default", "--at", "0", "--as", "cli:c")
    assert (code, out, err) == (0, "cli:c\n", "")


async def test_a_fork_made_inside_an_exchange_before_this_fix_still_answers(home):
    """Forks an older version made at any point: the parent's unfinished turn must not hold
    the fork's new messages back."""
    await _a_tool_exchange(home)
    config = build_config({}, home=home)
    async with opened_store(config) as store:
        await store.fork("cli:default", "cli:old", at_seq=2)
    await _answers_once(home, "cli:old")
