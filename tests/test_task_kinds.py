"""Typed task kinds (bot/runtime/kinds.py): the homes the previous release left behind
(tests/fixtures/checkpoints, written by 7338092) are read by today's kinds and their work
runs to its end; a checkpoint this build cannot read is refused and its task quarantined,
never run over; an older version is migrated."""

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from bot.agent import approval
from bot.agent.deps import AgentDeps
from bot.app.config import build_config
from bot.app.wiring import build_registry
from bot.llm.scripted import ScriptedModel
from bot.memory import embeddings
from bot.memory.embeddings import OpenAIEmbedder
from bot.runtime import (
    Checkpoint,
    Continue,
    Done,
    KindSpec,
    Phase,
    Refused,
    Registry,
    Runner,
    RunnerOptions,
    Sleep,
    TaskDef,
)
from bot.runtime.kinds import VERSION_KEY
from bot.tools import ToolBox, builtin_tools
from connectors.terminal import TerminalChannel
from store import DONE, FAILED, Writes, open_store
from tests.fakes.embedding_server import FakeEmbeddings
from tests.fixtures.checkpoints.scenarios import SCENARIOS

FIXTURES = sorted((Path(__file__).parent / "fixtures" / "checkpoints").glob("*.json"))
TABLES = ("conversations", "entries", "tasks", "submissions", "usage")
OPTIONS = RunnerOptions(concurrency=4, lease_seconds=5, retry_base_seconds=0.01,
                        retry_max_seconds=0.02, poll_seconds=0.02)


def fixture(path: Path) -> dict:
    return json.loads(path.read_text())


class NoStore:
    """Stands for the store where the kinds are only looked at, not run."""


def kinds_of(deps) -> dict:
    registry = build_registry(deps)
    return {kind: registry.get(kind) for kind in registry.kinds()}


@contextlib.asynccontextmanager
async def home(tmp_path, snapshot: dict | None, scenario, *, edit=None):
    """A home holding `snapshot`'s rows (a home the old release left), opened by today's
    code with the scenario's model: (store, deps, runner)."""
    db = tmp_path / "steward.db"
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    await store.close()
    if snapshot is not None:
        rows = json.loads(json.dumps(snapshot))
        for task in rows["tasks"]:
            if task["state"] == "pending":
                task["run_after"] = 0.0  # time has passed since: what slept is due
            if edit is not None:
                edit(task)
        with sqlite3.connect(db) as conn:
            for table in TABLES:
                for row in rows[table]:
                    cols = ", ".join(row)
                    marks = ", ".join("?" for _ in row)
                    conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})",
                                 list(row.values()))
    store = await open_store(f"sqlite+aiosqlite:///{db}")
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.close)
        http = await stack.enter_async_context(httpx.AsyncClient())
        config = build_config({"runtime": {"retry_base_seconds": 0.01,
                                           "retry_max_seconds": 0.02}, **scenario.config},
                              home=tmp_path)
        deps = AgentDeps(store=store, config=config, client=ScriptedModel(scenario.model),
                         toolbox=ToolBox(*builtin_tools()), http=http)
        deps.channels["cli"] = TerminalChannel(deps.events)
        if scenario.embed:
            fake = await stack.enter_async_context(FakeEmbeddings())
            # The model the old home's embedding task was started for.
            embeddings.attach(store, OpenAIEmbedder(http, base_url=fake.base_url,
                                                    model=fake.model, batch_size=1))
        runner = Runner(store, build_registry(deps), OPTIONS)
        yield store, deps, runner


async def finish(store, runner, scenario) -> None:
    await runner.recover(steal_all=True)
    for _ in range(3):
        if scenario.approve:  # the person answers what was asked (or it expired)
            for t in await store.list_tasks(kind=approval.KIND, active=True, limit=100):
                if t.phase == "waiting":
                    await approval.answer(store, t.id, True, by=t.inputs["who"])
        await asyncio.wait_for(runner.run(until_idle=True, horizon=0.5), 60)


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_every_checkpoint_the_previous_release_wrote_is_read_and_written_back_the_same(
        path, tmp_path):
    """Each task of each fixture: its kind reads the checkpoint into its phase's type, and
    writes it back exactly as that release did (so a rollback reads it too)."""
    deps = AgentDeps(store=NoStore(), config=build_config({}, home=tmp_path),
                     client=ScriptedModel([]), toolbox=ToolBox(), http=None)
    kinds = kinds_of(deps)
    for task in fixture(path)["rows"]["tasks"]:
        spec = kinds[task["kind"]].spec
        raw = json.loads(task["checkpoint"]) if task["checkpoint"] else None
        phase, checkpoint = spec.read(task["phase"], raw)
        assert phase.name == task["phase"]
        if raw is None:
            assert checkpoint is None
        else:
            assert isinstance(checkpoint, phase.checkpoint)
            assert spec.write(checkpoint) == raw


def test_every_kind_declares_its_phases_and_version(tmp_path):
    deps = AgentDeps(store=NoStore(), config=build_config({}, home=tmp_path),
                     client=ScriptedModel([]), toolbox=ToolBox(), http=None)
    kinds = kinds_of(deps)
    assert set(kinds) >= {"turn", "llm_call", "tool_call", "deliver", "compact", "approval",
                          "embed_entries"}
    for kind, definition in kinds.items():
        assert definition.spec is not None and definition.spec.name == kind
        assert definition.spec.version >= 1 and definition.spec.phases[0].name == ""
    seen = {(f["kind"], f["phase"]) for f in map(fixture, FIXTURES)}
    # Every phase of a turn is among the homes the old release left.
    assert {("turn", p.name) for p in kinds["turn"].spec.phases} <= seen


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
async def test_a_home_the_previous_release_left_finishes_its_work(path, tmp_path):
    f = fixture(path)
    scenario = SCENARIOS[f["scenario"]]
    async with home(tmp_path, f["rows"], scenario) as (store, deps, runner):
        await finish(store, runner, scenario)
        tasks = {t.id: t for t in await store.list_tasks(limit=10_000)}
        focus = tasks[f["task"]]
        turns = [t for t in tasks.values() if t.kind == "turn"]
        assert all(t.state == DONE for t in turns), \
            [(t.id, t.state, t.phase, t.error) for t in turns]
        for t in tasks.values():
            if t.kind == "embed_entries":  # it sleeps between sweeps, never ends
                assert t.state != FAILED and t.phase == "sweep", (t.state, t.error)
            else:
                assert t.state == DONE, (t.kind, t.state, t.phase, t.error)
        assert focus.kind == f["kind"]
        if not f["rows"]["conversations"]:  # left before anything was said (embeddings)
            assert not turns
            return
        # Every message was answered, once.
        conv = await store.get_conversation(f"cli:{f['scenario']}")
        entries = await store.entries_page(conv.id, limit=500)
        asked = max(e.seq for e in entries if e.kind == "user")
        answered = [e.data["answers_upto"] for e in entries
                    if e.kind == "assistant" and (e.data or {}).get("final")]
        assert answered and max(answered) >= asked and len(set(answered)) == len(answered)
        # None of it was an apology (a turn quarantined as unreadable ends with one).
        assert not [e.text for e in entries if (e.data or {}).get("error")]


async def test_a_turn_whose_first_call_failed_a_try_under_the_previous_release_runs(
        tmp_path):
    """7338092 kept the checkpoint its first LLM call was made from when that try failed,
    in the first phase: read, and the turn starts again."""
    path = next(p for p in FIXTURES if p.stem.startswith("plain-turn-start-pending"))
    f = fixture(path)

    def failed_try(task):
        if task["id"] == f["task"]:
            task.update(phase="", state="pending", attempts=1, error="RuntimeError: x",
                        checkpoint=json.dumps({"upto": 1, "round": 0, "note": "n"}))

    async with home(tmp_path, f["rows"], SCENARIOS["plain"], edit=failed_try) as (
            store, deps, runner):
        await finish(store, runner, SCENARIOS["plain"])
        turn = await store.get_task(f["task"])
        assert turn.state == DONE and turn.result["text"] == "Hello there.", turn.result


def future(task: dict, kind: str) -> None:
    """`task`, if of `kind`, as a newer build would have left it."""
    if task["kind"] == kind and task["checkpoint"]:
        cp = json.loads(task["checkpoint"])
        task["checkpoint"] = json.dumps({**cp, VERSION_KEY: 2, "new_field": 1})


async def test_a_turn_a_newer_build_left_is_quarantined_and_the_person_told(tmp_path):
    path = next(p for p in FIXTURES if p.stem.startswith("plain-turn-after_llm-waiting"))
    f = fixture(path)
    scenario = SCENARIOS["plain"]
    async with home(tmp_path, f["rows"], scenario,
                    edit=lambda t: future(t, "turn")) as (store, deps, runner):
        await finish(store, runner, scenario)
        turn = await store.get_task(f["task"])
        assert turn.state == DONE  # told, then ended: the conversation's queue moves on
        assert "left by another version of Steward" in turn.result["text"]
        assert "newer build" in turn.result["text"]
        # What it waited for is not read: the model's answer was never given.
        conv = await store.get_conversation("cli:plain")
        texts = [e.text for e in await store.entries_page(conv.id, limit=100)]
        assert "Hello there." not in "\n".join(texts)


async def test_an_effect_a_newer_build_left_fails_as_a_poison_without_running(tmp_path):
    path = next(p for p in FIXTURES if p.stem.startswith("plain-deliver-effect-running"))
    f = fixture(path)
    scenario = SCENARIOS["plain"]
    async with home(tmp_path, f["rows"], scenario,
                    edit=lambda t: future(t, "deliver")) as (store, deps, runner):
        await finish(store, runner, scenario)
        [delivery] = await store.list_tasks(kind="deliver", limit=10)
        assert delivery.state == FAILED and delivery.failure == "poison"
        assert "version 2" in delivery.error and "newer build" in delivery.error


class Counted(Checkpoint):
    count: int


class Counter(TaskDef):
    """Version 2 of a kind whose version 1 called the count `n`."""

    kind = "counter"

    async def step(self, ctx):
        return await self.spec.run(self, ctx)

    async def start(self, ctx, _):
        return Continue("counting", Counted(count=0))

    async def counting(self, ctx, cp: Counted):
        if cp.count >= 3:
            return Done({"count": cp.count})
        return Continue("counting", cp.but(count=cp.count + 1))

    spec = KindSpec("counter", version=2, phases=(
        Phase("", None, start),
        Phase("counting", Counted, counting),
    ), migrations={1: lambda phase, cp: ("counting" if phase == "count" else phase,
                                         {"count": cp["n"]} if cp else cp)})


class CounterV1(TaskDef):
    """The same kind as the build before left it: asleep in phase "count" at n = 2."""

    kind = "counter"

    async def step(self, ctx):
        return Sleep(3600, "count", {"n": 2})


async def test_an_older_version_is_migrated_and_runs_on(store):
    """A version 1 checkpoint (another phase name, another field) is brought up to
    version 2 and the task carries on from it; what it writes is version 2."""
    w = Writes()
    task_id = w.spawn("counter", {})
    await store.commit(w)
    await asyncio.wait_for(Runner(store, Registry(CounterV1()), OPTIONS).run(
        until_idle=True), 30)
    left = await store.get_task(task_id)
    assert (left.phase, left.checkpoint) == ("count", {"n": 2})
    w = Writes()
    w.wake(task_id)
    await store.commit(w)
    written = []
    commit = store.commit

    async def recorded(writes, *a, **kw):
        if writes.task_update is not None:
            written.append(writes.task_update.checkpoint)
        return await commit(writes, *a, **kw)

    store.commit = recorded
    await asyncio.wait_for(Runner(store, Registry(Counter()), OPTIONS).run(
        until_idle=True), 30)
    done = await store.get_task(task_id)
    assert done.state == DONE and done.result == {"count": 3}
    assert {"count": 3, VERSION_KEY: 2} in written


def test_an_effect_may_start_from_nothing_or_from_a_try_that_did_not_happen(tmp_path):
    deps = AgentDeps(store=NoStore(), config=build_config({}, home=tmp_path),
                     client=ScriptedModel([]), toolbox=ToolBox(), http=None)
    spec = kinds_of(deps)["deliver"].spec
    assert spec.read("", None)[1] is None
    # What the runner keeps of a try that raised NotPerformed before its intent.
    assert spec.read("", {"not_performed": True})[1].not_performed
    with pytest.raises(Refused):
        spec.read("effect", None)


def test_what_a_kind_cannot_read_is_refused_with_the_reason():
    spec = Counter.spec
    with pytest.raises(Refused, match="version 3, written by a newer build"):
        spec.read("counting", {"count": 1, VERSION_KEY: 3})
    with pytest.raises(Refused, match="no phase 'elsewhere'"):
        spec.read("elsewhere", None)
    with pytest.raises(Refused, match="unreadable checkpoint"):
        spec.read("counting", {"count": 1, VERSION_KEY: 2, "mystery": True})
    with pytest.raises(Refused, match="unreadable checkpoint"):
        spec.read("counting", {VERSION_KEY: 2})
    with pytest.raises(Refused, match="no valid version"):
        spec.read("counting", {"count": 1, VERSION_KEY: "two"})
    with pytest.raises(ValueError, match="no migration from version"):
        KindSpec("k", version=2, phases=(Phase("", None),))
