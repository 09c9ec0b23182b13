"""The offline demo model shows what Steward does before any provider is configured, with
real `steward` commands: it keeps a fact and says it back in a later conversation,
searches what was said, and sets a reminder that `steward run` fires."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path


def environment(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_", "XDG_"))}
    config = tmp_path / "config.toml"
    config.write_text('[llm]\nprovider = "scripted"\n')
    env.update(STEWARD_HOME=str(tmp_path / "home"), STEWARD_CONFIG=str(config))
    return env


async def steward(tmp_path: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", *args, env=environment(tmp_path), cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    return out.decode()


async def test_the_demo_remembers_searches_and_reminds(tmp_path):
    told = await steward(tmp_path, "ask", "remember that my sister lives in Graz")
    assert "remember_fact" in told, told
    known = await steward(tmp_path, "ask", "--session", "cli:later", "what do you know about me?")
    assert "my sister lives in Graz" in known, known

    await steward(tmp_path, "ask", "I finally went to the new climbing gym on Saturday")
    found = await steward(tmp_path, "ask", "--session", "cli:later", "When did I go climbing?")
    assert found.startswith("I found:") and "climbing gym on Saturday" in found, found

    set_up = await steward(tmp_path, "ask", "remind me in 2 seconds to stretch")
    assert "schedule" in set_up and "failed" not in set_up, set_up
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "run", env=environment(tmp_path), cwd=tmp_path,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        for _ in range(30):  # each look is a `steward log` of its own
            log = await steward(tmp_path, "log", "cli:default", "--json", "--limit", "50")
            texts = [json.loads(line)["text"] for line in log.splitlines()]
            if "Reminder: stretch." in texts:
                break
            await asyncio.sleep(1.0)
        else:
            raise AssertionError(texts)
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
