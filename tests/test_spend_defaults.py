"""Spend is bounded out of the box (issue 32): a daily cap on what everyone together costs
and a per-person rate of model calls an hour, both on in a fresh config, both shown by
`steward init` and `steward doctor`, both 0 = off. The rate is counted in the store (one
submission per model call a person may make in an hour), so it holds exactly across
several runners and a restart; its notice is said in full once per hour, then briefly."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bot.agent import budget
from bot.app.config import build_config
from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response
from tests.fakes.agent_rig import rig_factory
from tests.fakes.slack_rig import last_user_text
from tests.test_cli import steward, steward_env

RATE = 120  # the default person_calls_per_hour
DAILY = 10.0  # the default daily_limit, in US dollars
FULL = "I have reached your hourly rate"
SHORT = "(Still at your hourly rate"


@pytest.fixture
async def make_rig(store, tmp_path):
    async with rig_factory(store, tmp_path) as make:
        yield make


async def clear_of_the_hour(margin: float = 60.0) -> None:
    """The rate's window is the clock hour: a test that counts calls in one window waits
    out the last minute of an hour rather than straddle two."""
    left = 3600 - time.time() % 3600
    if left < margin:
        await asyncio.sleep(left + 1)


def answering() -> ScriptedModel:
    return ScriptedModel(lambda r: Response(text=f"answer to {last_user_text(r)}"))


async def answers(store, session: str) -> list[str]:
    conversation = await store.get_conversation(session)
    return [e.text for e in await store.entries_page(conversation.id, limit=20)
            if e.kind == "assistant" and (e.data or {}).get("final")]


def test_a_fresh_config_bounds_spend(tmp_path):
    limits = build_config({}, home=tmp_path).limits
    assert (limits.daily_limit, limits.person_calls_per_hour) == (DAILY, RATE)
    assert limits.limited
    # The daily default is ten dollars' worth in the configured currency...
    yen = build_config({"limits": {"currency": "JPY", "per_usd": 150.0}}, home=tmp_path)
    assert yen.limits.daily_limit == 1500.0
    # ...and each is changeable, 0 = off; with all off nothing is checked.
    off = build_config({"limits": {"daily_limit": 0.0, "person_calls_per_hour": 0}},
                       home=tmp_path).limits
    assert (off.daily_limit, off.person_calls_per_hour, off.limited) == (0.0, 0, False)
    assert build_config({"limits": {"daily_limit": 0.0}}, home=tmp_path).limits.limited
    assert build_config({"limits": {"person_calls_per_hour": 0}},
                        home=tmp_path).limits.limited


async def test_a_flood_of_threads_from_one_sender_is_held_to_the_rate(store, make_rig):
    """One sender opens RATE + 8 threads at once, served by two runners (two workers on one
    store): exactly RATE model calls for them; another person is answered as usual; a
    third runner started afterwards (a restart) still knows the hour is used up."""
    await clear_of_the_hour()
    model = answering()
    first, second = make_rig(model), make_rig(model)  # the default config
    flood = RATE + 8
    for n in range(flood):
        await first.say(f"flood {n}", session=f"cli:ana-{n}", owner="ana")
    for n in range(3):
        await first.say(f"bob {n}", session=f"cli:bob-{n}", owner="bob")
    await asyncio.gather(first.run(), second.run())

    asked = [last_user_text(r) for r in model.requests]
    assert sum(text.startswith("flood") for text in asked) == RATE
    assert sorted(text for text in asked if text.startswith("bob")) == ["bob 0", "bob 1",
                                                                        "bob 2"]
    said = [a for n in range(flood) for a in await answers(store, f"cli:ana-{n}")]
    assert len(said) == flood  # every thread answered once
    assert sum(a.startswith("answer to flood") for a in said) == RATE
    assert sum(a.startswith(FULL) for a in said) == 1  # the notice in full once an hour
    assert sum(a.startswith(SHORT) for a in said) == flood - RATE - 1
    [full] = [a for a in said if a.startswith(FULL)]
    assert f"({RATE} model calls an hour)" in full and "[limits]" in full
    # Only the full notice goes out with the answers: the short ones are recorded, not
    # sent (a flood of threads must not make a flood of posts).
    sent = [t.inputs["text"] for t in await store.list_tasks(kind="deliver", limit=1000)]
    assert sum(t.startswith("answer to flood") for t in sent) == RATE
    assert sum(t.startswith(FULL) for t in sent) == 1
    assert not any(t.startswith(SHORT) for t in sent)
    for n in range(3):
        assert await answers(store, f"cli:bob-{n}") == [f"answer to bob {n}"]

    restarted = make_rig(model)
    await restarted.say("after the restart", session="cli:ana-late", owner="ana")
    await restarted.run()
    [late] = await answers(store, "cli:ana-late")
    assert late.startswith(SHORT)
    assert len(model.requests) == RATE + 3


async def test_the_rate_is_per_hour_and_its_notice_once_per_hour(store, tmp_path):
    config = build_config({"limits": {"person_calls_per_hour": 2}}, home=tmp_path)
    hour = (time.time() // 3600 + 10) * 3600  # an hour of its own
    verdicts = [await budget.check(store, config, "ana", at=hour + n) for n in range(5)]
    assert [v.over is None for v in verdicts] == [True, True, False, False, False]
    assert [v.over.repeated for v in verdicts[2:]] == [False, True, True]
    cap = verdicts[2].over
    assert (cap.calls, cap.limit, cap.personal) == (True, 2, True)
    assert budget.over_notice(cap, "USD").startswith(f"{FULL} (2 model calls an hour)")
    assert budget.over_notice(verdicts[3].over, "USD").startswith(SHORT)
    # Another person, and the next hour, start afresh.
    assert (await budget.check(store, config, "bob", at=hour + 5)).over is None
    assert (await budget.check(store, config, "ana", at=hour + 3600)).over is None
    # No owner (the terminal's own sessions): no person to count for.
    for _ in range(3):
        assert (await budget.check(store, config, None, at=hour)).over is None


async def test_a_rate_of_zero_is_off(store, make_rig):
    await clear_of_the_hour()
    model = answering()
    rig = make_rig(model, config={"limits": {"person_calls_per_hour": 0}})
    for n in range(5):
        await rig.say(f"q {n}", session=f"cli:ana-{n}", owner="ana")
    await rig.run()
    assert len(model.requests) == 5


async def test_init_writes_the_defaults_and_says_them(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    code, out, err = await steward(home, "init", "--yes", "--provider", "demo",
                                   "--timezone", "UTC", "--slack", "off", "--email", "off",
                                   env=steward_env(home))
    assert code == 0, err
    text = (home / "xdg" / "steward" / "config.toml").read_text()
    assert "[limits]" in text and f"daily_limit = {DAILY}" in text
    assert f"person_calls_per_hour = {RATE}" in text
    assert f"limits: 10.00 USD a day in all, {RATE} model calls an hour per person" in out


async def test_doctor_has_a_row_for_the_caps_and_the_rate(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    config = home / "config.toml"

    async def row() -> dict:
        code, out, err = await steward(home, "doctor", "--json", env=steward_env(
            home, STEWARD_CONFIG=str(config)))
        assert "Traceback" not in out + err, err
        return {r["check"]: r for r in map(json.loads, out.splitlines())}["limits"]

    config.write_text('[llm]\nprovider = "scripted"\n')
    said = await row()
    assert said["status"] == "ok", said
    assert f"10.00 USD a day in all, {RATE} model calls an hour per person" in said["detail"]

    config.write_text('[llm]\nprovider = "scripted"\n[limits]\ndaily_limit = 0.0\n'
                      'person_calls_per_hour = 0\nperson_monthly_limit = 30.0\n'
                      'currency = "EUR"\n')
    said = await row()
    assert said["status"] == "ok" and said["detail"].startswith(
        "30.00 EUR a month per person; no daily cap; no hourly rate"), said

    config.write_text('[llm]\nprovider = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
                      'model = "m"\n[limits]\ndaily_limit = 0.0\nperson_calls_per_hour = 0\n')
    said = await row()
    assert said["status"] == "warn" and "nothing bounds" in said["detail"], said
    assert "person_calls_per_hour" in said["fix"]
