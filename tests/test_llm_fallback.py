"""Model fallback and the summary model, with a real `steward` and two fake providers on
127.0.0.1: a primary that stays overloaded hands the request to `[[llm.fallbacks]]` after
its retries, and the ledger says who answered; a primary that answers, or refuses the key,
never reaches the fallback; compaction uses `[llm] summary_model`."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy import select

from store import open_store
from store.schema import usage
from tests.fakes.llm_server import FakeLLMServer, Reply

SESSION = "cli:fallback"


@pytest.fixture
def primary():
    with FakeLLMServer(lambda _r, _w: Reply(text="from the primary")) as server:
        yield server


@pytest.fixture
def fallback():
    with FakeLLMServer(lambda r, _w: Reply(text=f"from the fallback ({r['model']})",
                                           model=r["model"])) as server:
        yield server


def make_home(tmp_path: Path, store_url: str, primary: str, fallback: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.toml").write_text(f"""
[store]
url = "{store_url}"
[llm]
provider = "openai"
base_url = "{primary}/v1"
model = "big-model"
summary_model = "cheap-model"
[[llm.fallbacks]]
provider = "anthropic"
base_url = "{fallback}"
model = "other-model"
api_key_env = "FALLBACK_KEY"
output_price_per_mtok = 1000000.0
[compaction]
keep_recent_tokens = 0  # `compact` then summarises everything but the last answer
[runtime]
max_attempts = 2
retry_base_seconds = 0.01
retry_max_seconds = 0.02
""")
    return home


async def steward(home: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_"))}
    env.update(STEWARD_HOME=str(home), STEWARD_CONFIG=str(home / "config.toml"),
               OPENAI_API_KEY="sk-primary", FALLBACK_KEY="sk-fallback")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=env, cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    return proc.returncode, out.decode(), err.decode()


async def ledger(store_url: str) -> list[tuple[str, str, bool, float]]:
    store = await open_store(store_url)
    try:
        async with store.engines.read.connect() as conn:
            rows = (await conn.execute(select(usage.c.provider, usage.c.model, usage.c.ok,
                                              usage.c.cost_usd).order_by(usage.c.id))).all()
        return [tuple(r) for r in rows]
    finally:
        await store.close()


async def test_an_overloaded_primary_hands_over_to_the_fallback(store_url, tmp_path, primary,
                                                                 fallback):
    primary.responder = lambda _r, _w: Reply(status=503)
    home = make_home(tmp_path, store_url, primary.url, fallback.url)
    code, out, err = await steward(home, "ask", "--session", SESSION, "hello")
    assert code == 0, err[-3000:]
    assert "from the fallback (other-model)" in out
    assert primary.count("/v1/chat/completions") == 2  # its own retries first
    assert fallback.count("/v1/messages") == 1
    assert fallback.requests[0].headers["x-api-key"] == "sk-fallback"
    rows = await ledger(store_url)
    assert [(p, m, ok) for p, m, ok, _ in rows] == [
        ("openai", "big-model", False), ("openai", "big-model", False),
        ("anthropic", "other-model", True)]
    assert rows[-1][3] == pytest.approx(7.0)  # priced by the fallback's own prices


async def test_a_working_primary_or_a_wrong_key_never_reaches_the_fallback(
        store_url, tmp_path, primary, fallback):
    home = make_home(tmp_path, store_url, primary.url, fallback.url)
    code, out, err = await steward(home, "ask", "--session", SESSION, "hello")
    assert code == 0 and "from the primary" in out, err[-3000:]
    primary.responder = lambda _r, _w: Reply(status=401)
    code, out, err = await steward(home, "ask", "--session", SESSION, "again")
    assert "from the fallback" not in out
    assert fallback.count("/v1/messages") == 0


async def test_compaction_uses_the_summary_model(store_url, tmp_path, primary, fallback):
    home = make_home(tmp_path, store_url, primary.url, fallback.url)
    for text in ("one", "two"):
        code, _, err = await steward(home, "ask", "--session", SESSION, text)
        assert code == 0, err[-3000:]
    code, _, err = await steward(home, "compact", SESSION)
    assert code == 0, err[-3000:]
    models = [r.body["model"] for r in primary.requests]
    assert models == ["big-model", "big-model", "cheap-model"]
