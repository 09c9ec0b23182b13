"""Spending caps, from the ledger's cost: at a cap the turn answers with a short notice and
the model is not called; near one the answer says so once per cap and period; a person's
cap stops only that person; `spend_report` adds up by person, model and day."""

from __future__ import annotations

import time

import pytest

from bot.llm.scripted import ScriptedModel
from bot.llm.types import Response, Usage
from store import UsageRecord, Writes
from tests.fakes.agent_rig import rig_factory

COST = 0.40  # what each scripted call costs, as a provider that reports cost says


def costly() -> ScriptedModel:
    return ScriptedModel(lambda r: Response(
        text=f"answer {len(r.messages)}",
        usage=Usage(input_tokens=1000, output_tokens=10, cost_usd=COST)))


@pytest.fixture
async def make_rig(store, tmp_path):
    async with rig_factory(store, tmp_path) as make:
        yield make


async def answers(rig, session: str) -> list[str]:
    conversation = await rig.store.get_conversation(session)
    return [e.text for e in await rig.store.entries_page(conversation.id, limit=100)
            if e.kind == "assistant" and (e.data or {}).get("final")]


async def test_at_the_daily_cap_the_model_is_not_called(store, make_rig):
    model = costly()
    rig = make_rig(model, config={"limits": {"daily_limit": 1.0, "warn_at": 0.7}})
    for n in range(4):
        await rig.say(f"question {n}", owner="ana")
        await rig.run()
    said = await answers(rig, "cli:rig")
    assert len(said) == 4
    # Spent before each call: 0, 0.40, 0.80 (past 70 %: the note), 1.20 (the cap: no call).
    assert len(model.requests) == 3
    assert said[2].endswith("(Spending is at 0.80 USD of the daily spending cap of 1.00 USD.)")
    assert "Spending" not in said[0] + said[1]
    assert said[3].startswith("I have reached the daily spending cap (1.20 USD of 1.00 USD)")


async def test_a_persons_cap_stops_only_that_person(store, make_rig):
    model = costly()
    rig = make_rig(model, config={"limits": {"person_daily_limit": 0.5, "currency": "EUR",
                                             "per_usd": 0.5}})
    for n in range(4):  # spent before each: 0, 0.20, 0.40 (noted), 0.60 EUR: over her cap
        await rig.say(f"ana {n}", session="cli:ana", owner="ana")
        await rig.run()
    await rig.say("bob 0", session="cli:bob", owner="bob")
    await rig.run()
    ana, bob = await answers(rig, "cli:ana"), await answers(rig, "cli:bob")
    assert len(model.requests) == 4
    assert ana[-1].startswith("I have reached your daily spending cap (0.60 EUR of 0.50 EUR)")
    assert not bob[0].startswith("I have reached")


async def test_no_caps_no_checks(store, make_rig):
    model = costly()
    rig = make_rig(model, config={"limits": {"daily_limit": 0.0, "person_calls_per_hour": 0}})
    for n in range(3):
        await rig.say(f"q {n}", owner="ana")
        await rig.run()
    assert len(model.requests) == 3
    assert not any("Spending" in a or "cap" in a for a in await answers(rig, "cli:rig"))


async def test_the_report_adds_up_by_person_model_and_day(store):
    ana = await store.ensure_conversation("cli:ana", owner="ana", scope="private:ana")
    bob = await store.ensure_conversation("cli:bob", owner="bob", scope="private:bob")
    day = 86400.0
    base = (time.time() // day - 3) * day  # midnight UTC, three days ago
    rows = [(ana.id, "m1", base + 10, 0.5), (ana.id, "m1", base + 20, 0.25),
            (ana.id, "m2", base + 30, 1.0), (bob.id, "m1", base + day + 5, 2.0),
            (None, "m1", base + 40, 0.125)]
    w = Writes()
    for conv, model, _, cost in rows:
        w.record_usage(UsageRecord(provider="p", model=model, input_tokens=1, output_tokens=2,
                                   cost_usd=cost, ok=True, conversation_id=conv))
    await store.commit(w)
    # Back-date them (the store stamps rows at commit): one UPDATE per row, by cost.
    from sqlalchemy import update

    from store.schema import usage
    async with store.engines.write.begin() as conn:
        for _, _, at, cost in rows:
            await conn.execute(update(usage).where(usage.c.cost_usd == cost)
                               .values(created_at=at))
    report = await store.spend_report(base)
    first = int(base // day)
    assert report == [
        {"owner": None, "model": "m1", "day": first, "calls": 1, "input_tokens": 1,
         "output_tokens": 2, "cost": 0.125},
        {"owner": "ana", "model": "m1", "day": first, "calls": 2, "input_tokens": 2,
         "output_tokens": 4, "cost": 0.75},
        {"owner": "ana", "model": "m2", "day": first, "calls": 1, "input_tokens": 1,
         "output_tokens": 2, "cost": 1.0},
        {"owner": "bob", "model": "m1", "day": first + 1, "calls": 1, "input_tokens": 1,
         "output_tokens": 2, "cost": 2.0}]
    assert await store.spend_since(base) == pytest.approx(3.875)
    assert await store.spend_since(base, owner="ana") == pytest.approx(1.75)
    assert await store.spend_since(base + day, owner="ana") == 0.0


async def test_steward_usage_shows_spend_by_person_model_and_day(tmp_path):
    """A real `steward`: two answers of the priced demo model, then `usage` in both forms."""
    import asyncio
    import json
    import os
    import sys

    config = tmp_path / "config.toml"
    config.write_text('[llm]\nprovider = "scripted"\ninput_price_per_mtok = 1000000.0\n'
                      '[limits]\ncurrency = "EUR"\nper_usd = 2.0\n'
                      'daily_limit = 0.0\n')  # a dollar a token: past the default cap
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STEWARD_", "OPENAI_",
                                                                    "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(tmp_path / "home"), STEWARD_CONFIG=str(config))

    async def steward(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot", *args, env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()[-2000:]
        return out.decode()

    assert (await steward("usage")).strip() == "no model calls in the last 30 days"
    for text in ("hello there", "what time is it?"):
        await steward("ask", text)
    rows = [json.loads(line) for line in (await steward("usage", "--json")).splitlines()]
    assert len(rows) == 1, rows
    [row] = rows
    assert (row["model"], row["currency"]) == ("offline-demo", "EUR") and row["calls"] >= 2
    assert row["cost"] == pytest.approx(2.0 * row["input_tokens"])  # 1 USD a token, 2 EUR
    table = (await steward("usage")).splitlines()
    assert table[0].split() == ["DAY", "PERSON", "MODEL", "CALLS", "INPUT_TOKENS",
                                "OUTPUT_TOKENS", "COST"]
    assert table[-1] == f"total {row['cost']:.2f} EUR"


async def test_a_scheduled_job_at_the_cap_is_not_sent_to_the_model(store, tmp_path):
    """An occurrence of a schedule is a turn like any other: at its person's cap it gets
    the notice and the model is not called."""
    import httpx

    from bot.app.config import build_config
    from bot.app.wiring import wire
    from bot.scheduler.loop import Scheduler
    from bot.tools import ToolBox
    from store import ScheduleWrite, new_id
    from tests.fakes.agent_rig import RIG_OPTIONS

    conversation = await store.ensure_conversation("cli:ana", owner="ana", scope="private:ana")
    spent = Writes()
    spent.record_usage(UsageRecord(provider="p", model="m", input_tokens=1, output_tokens=1,
                                   cost_usd=2.0, ok=True, conversation_id=conversation.id))
    await store.commit(spent)
    model = costly()
    async with httpx.AsyncClient() as http:
        app = wire(build_config({"limits": {"person_daily_limit": 1.0}}, home=tmp_path), store,
                   model, http, toolbox=ToolBox(), options=RIG_OPTIONS)
        deps = app.deps
        w = Writes()
        due = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(time.time() - 60))
        w.save_schedule(ScheduleWrite(new_id(), "plants", "Water the plants.",
                                      {"kind": "date", "at": due}, "UTC",
                                      {"channel": "cli", "reply_to": {}}, time.time() - 1,
                                      conversation.id))
        await store.commit(w)
        assert await Scheduler(deps).fire_due() == 1
        await app.runner.run(until_idle=True)
    [said] = [e.text for e in await store.entries_page(conversation.id, limit=20)
              if e.kind == "assistant" and (e.data or {}).get("final")]
    assert said.startswith("I have reached your daily spending cap (2.00 USD of 1.00 USD)")
    assert model.requests == []
