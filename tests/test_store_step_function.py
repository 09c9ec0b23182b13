"""PostgreSQL's `steward_step` is generated from the step's statements
(store/postgres/step_function.py): the function a migrated database holds must be that
text exactly, a changed text must come with a migration that recreates it, and a database
left with an older function (an early 0015) gets today's."""

import re
import uuid
from pathlib import Path

from alembic import command
from alembic.config import Config

from store import TaskUpdate, Writes
from store.engine import MIGRATIONS, create_engines, migrate
from store.postgres import step_function
from store.records import WAITING
from tests.conftest import PG_URL, _pg_admin


def _functions(sync_conn) -> list[tuple[str, str]]:
    """(arguments, body) of each `steward_step` in the store's schema."""
    return [tuple(r) for r in sync_conn.exec_driver_sql(
        "SELECT pg_get_function_arguments(oid), prosrc FROM pg_proc "
        "WHERE proname = 'steward_step' AND pronamespace = current_schema()::regnamespace")]


def _expected_arguments() -> str:
    spelled = {"float8": "double precision", "int": "integer", "bool": "boolean"}

    def pg(t: str) -> str:
        base = t.removesuffix("[]")
        return spelled.get(base, base) + ("[]" if t.endswith("[]") else "")

    return ", ".join(f"{n} {pg(t)}" for n, t in step_function.ARGS)


def _to(revision: str):
    def run(sync_conn) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = sync_conn
        command.upgrade(cfg, revision)
    return run


async def _schema():
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await _pg_admin(f'CREATE SCHEMA "{schema}"')
    return schema, create_engines(f"{PG_URL}?schema={schema}")


async def test_the_function_in_a_migrated_database_is_the_generated_one():
    schema, engines = await _schema()
    try:
        await migrate(engines)
        async with engines.write.connect() as conn:
            assert await conn.run_sync(_functions) == [(_expected_arguments(),
                                                        step_function.BODY)]
    finally:
        await engines.dispose()
        await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


async def test_an_older_function_left_by_an_early_0015_is_replaced():
    """An early 0015 created the function with another text; `CREATE OR REPLACE` of a
    later 0015 never reached databases already past it. Upgrading puts today's in."""
    schema, engines = await _schema()
    try:
        async with engines.write.begin() as conn:
            await conn.run_sync(_to("0017"))
            [(arguments, body)] = await conn.run_sync(_functions)
            assert body != step_function.BODY  # 0015's own, hand-written
            await conn.exec_driver_sql(
                "CREATE OR REPLACE FUNCTION steward_step(" + arguments + ") RETURNS TABLE ("
                "seq_bases bigint[], deduped_ids text[], claimed_task tasks) LANGUAGE plpgsql "
                "AS $s$BEGIN RETURN; END$s$")
        await migrate(engines)
        async with engines.write.connect() as conn:
            assert await conn.run_sync(_functions) == [(_expected_arguments(),
                                                        step_function.BODY)]
    finally:
        await engines.dispose()
        await _pg_admin(f'DROP SCHEMA "{schema}" CASCADE')


def test_a_changed_function_comes_with_its_migration():
    """The newest migration that (re)creates the function names the digest of the text
    it was written for: changing a step's statements without one fails here."""
    digests = []
    for path in sorted((Path(MIGRATIONS) / "versions").glob("*.py")):
        found = re.search(r'^STEP_FUNCTION = "([0-9a-f]+)"', path.read_text(), re.M)
        if found:
            digests.append(found.group(1))
    assert digests, "no migration recreates steward_step"
    assert digests[-1] == step_function.DIGEST, (
        "the generated steward_step changed: add a migration that recreates it "
        f"(STEP_FUNCTION = \"{step_function.DIGEST}\")")


def test_the_call_sends_one_value_per_argument():
    w = Writes()
    w.append(1, "user", "hi")
    w.spawn("child", {}, parent_id="p", conversation_id=1)
    w.task_update = TaskUpdate("p", "me", WAITING, "after")
    assert len(step_function.call_args(w, 1.0)) == len(step_function.ARGS)
    assert len(step_function.call_args(Writes(), 1.0)) == len(step_function.ARGS)
