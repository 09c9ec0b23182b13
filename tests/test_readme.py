"""The README shows what Steward does, so what it shows is checked here and cannot drift:

- its first section's terminal session is run, command by command, as a new user would
  (a fresh HOME, no config, `steward run` going in "the first terminal"), and each
  command's output must match the lines shown, `…` standing for what changes from run to
  run (times, ids);
- the two commands at the top name the scripts that do what the README says they do;
- every relative link in README.md, docs/ and bench/RESULTS.md reaches a file of this
  repository (and the heading its `#anchor` names);
- docs/configuration.md lists every key of every config section with its default, as the
  pydantic models have them, and no key they do not have.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from bot.app.config import StewardConfig
from bot.llm.factory import DEMO_BANNER

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
ELLIPSIS = "…"


def first_section(text: str) -> str:
    """The README up to its second `## ` heading: what it is, the two commands, Try it."""
    headings = [m.start() for m in re.finditer(r"^## ", text, re.M)]
    assert len(headings) >= 2, "the README has no sections"
    return text[:headings[1]]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.M | re.S)


def session(block: str) -> list[tuple[str, list[str]]]:
    """A console block as (command, the lines it prints)."""
    shown: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            shown.append((line[2:], []))
        else:
            assert shown, f"output before any command: {line!r}"
            shown[-1][1].append(line)
    return shown


def matches(expected: str, actual: str) -> bool:
    """`expected` as the README shows it, `…` standing for any text."""
    pattern = ".*".join(re.escape(part) for part in expected.split(ELLIPSIS))
    return re.fullmatch(pattern, actual) is not None


def check_output(command: str, expected: list[str], actual: list[str]) -> None:
    if DEMO_BANNER not in expected:  # shown once in the README, printed by every command
        actual = [line for line in actual if line != DEMO_BANNER]
    where = f"`{command}` printed:\n" + "\n".join(actual) + "\nthe README shows:\n" \
        + "\n".join(expected)
    assert len(actual) == len(expected), where
    for want, got in zip(expected, actual, strict=True):
        assert matches(want, got), f"{where}\n(line {got!r} is not {want!r})"


async def demo_model_answers(env: dict[str, str], tmp_path: Path) -> bool:
    """Whether Steward, set up as `env` says, falls back to the offline demo model here, as
    `steward doctor` tells (a throwaway home: the README's stays fresh). A machine with a
    model server running (Ollama, llama.cpp) has Steward use it instead."""
    probe = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "doctor", "--json", env={**env, "HOME": str(tmp_path)},
        cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    out, _ = await asyncio.wait_for(probe.communicate(), 120)
    rows = [json.loads(line) for line in out.decode().splitlines()]
    (model,) = [row for row in rows if row["check"] == "model"]
    return "offline demo model" in model["detail"]


def newcomer(tmp_path: Path) -> dict[str, str]:
    """The environment of someone who just cloned the repository: their own HOME, nothing
    of Steward's configured, no API key."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("STEWARD_", "OPENAI_", "ANTHROPIC_", "XDG_"))}
    env["HOME"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir()
    (tmp_path / "probe").mkdir()  # where demo_model_answers looks
    return env


def test_the_matcher_takes_an_ellipsis_for_any_text_and_nothing_else():
    assert matches("first at ….", "first at Sun 06 Dec 2026 00:31 UTC.")
    assert matches("cli:later    6        …", "cli:later    6        2026-12-06T00:30:40+00:00")
    assert not matches("cli:later    6        …", "cli:later    7        2026-12-06")
    assert not matches("Done: todo: 1. [ ] buy milk", "Done: todo: 1. [ ] buy milk!")


def test_the_two_commands_are_the_scripts_that_do_what_the_readme_says():
    top = first_section(README.read_text(encoding="utf-8"))
    commands = [line.split("#")[0].strip() for line in blocks(top, "sh")[0].splitlines()]
    assert commands == ["bash scripts/run", "bash scripts/test"]
    run = (REPO / "scripts/run").read_text()
    assert "bash scripts/setup\n" in run and "exec .venv/bin/steward run" in run
    test = (REPO / "scripts/test").read_text()
    assert "bash scripts/setup test" in test and "scripts/install-test-deps" in test
    assert "constraints.txt" in (REPO / "scripts/setup").read_text()
    # every Debian package the test command may install is named in the README
    deps = (REPO / "scripts/install-test-deps").read_text()
    packages = re.findall(r"need\+=\(([\w.-]+)\)", deps)
    assert packages, "scripts/install-test-deps names no package"
    for package in packages:
        assert f"`{package}`" in top, f"the README does not say the tests install {package}"


async def test_the_first_conversation_prints_what_the_readme_shows(tmp_path):
    top = first_section(README.read_text(encoding="utf-8"))
    (block,) = blocks(top, "console")
    shown = session(block)
    env = newcomer(tmp_path)
    if not await demo_model_answers(env, tmp_path / "probe"):
        # a model found on this machine would answer instead of the demo model the README
        # shows; the user's config names the demo model, which then answers the same
        config = Path(env["HOME"]) / ".config" / "steward" / "config.toml"
        config.parent.mkdir(parents=True)
        config.write_text('[llm]\nprovider = "scripted"\n')
        shown = [(cmd, [line for line in out if line != DEMO_BANNER]) for cmd, out in shown]

    first, *commands = shown
    assert first[0] == 'export PATH="$PWD/.venv/bin:$PATH"' and not first[1]
    # run in the repository, as the README says ("in this directory")
    setting = await asyncio.create_subprocess_exec(
        "bash", "-c", first[0] + '; printf %s "$PATH"', cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE)
    env["PATH"] = (await asyncio.wait_for(setting.communicate(), 30))[0].decode()

    # the first terminal: `bash scripts/run` ends in this
    server = await asyncio.create_subprocess_exec(
        "steward", "run", env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    said = []
    try:
        while not said or b"running on" not in said[-1]:
            said.append(await asyncio.wait_for(server.stdout.readline(), 60))
            assert said[-1], f"steward run ended before it served: {said}"
        drained = asyncio.create_task(server.stdout.read())  # what it prints meanwhile
        # the second terminal
        for command, expected in commands:
            proc = await asyncio.create_subprocess_exec(
                "bash", "-c", command, env=env, cwd=tmp_path,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            out, _ = await asyncio.wait_for(proc.communicate(), 120)
            printed = out.decode().splitlines()
            assert proc.returncode == 0, (command, printed)
            check_output(command, expected, printed)
    finally:
        server.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(server.wait(), 60) == 0
    await drained


def test_the_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines < 200, f"README.md has {lines} lines: move detail into docs/"


# -- links ---------------------------------------------------------------------------------

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def documents() -> list[Path]:
    return [README, REPO / "ARCHITECTURE.md", REPO / "bench" / "RESULTS.md",
            *sorted((REPO / "docs").glob("*.md"))]


def anchors(path: Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings: lower case, punctuation dropped,
    spaces as hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_relative_link_reaches_a_file_of_the_repository():
    seen = 0
    for doc in documents():
        text = re.sub(r"^```.*?^```", "", doc.read_text(encoding="utf-8"), flags=re.M | re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https://, mailto:
            seen += 1
            name = doc.relative_to(REPO)
            if doc == README:
                assert not target.startswith("../"), f"{name}: {target} leaves the repository"
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            assert path.is_relative_to(REPO), f"{name}: {target} leaves the repository"
            assert path.exists(), f"{name}: {target} does not exist"
            if anchor:
                assert anchor in anchors(path), f"{name}: {target}: no such heading"
    assert seen > 20, "the links were not found"


def test_no_document_points_outside_the_clone():
    for doc in documents():
        assert "../shared" not in doc.read_text(encoding="utf-8"), doc


# -- the configuration reference -------------------------------------------------------------

REFERENCE = REPO / "docs" / "configuration.md"


def documented() -> dict[str, dict[str, str]]:
    """`## [section]` headings of docs/configuration.md, each with its table's rows as
    key -> default cell."""
    tables: dict[str, dict[str, str]] = {}
    current = None
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        if heading := re.fullmatch(r"## (\[\[?[\w.]+\]\]?)", line):
            current = tables.setdefault(heading.group(1), {})
        elif current is not None and (row := re.match(r"\| `(\w+)` \| ([^|]*) \|", line)):
            assert row.group(1) not in current, f"{row.group(1)} listed twice"
            current[row.group(1)] = row.group(2).strip()
    return tables


def models() -> dict[str, type[BaseModel]]:
    """Every table of the file: the sections, and the tables inside them given as lists
    of tables (`[[mcp.servers]]`; `[[llm.fallbacks]]` is `[llm]` again)."""
    found = {}
    for name, field in StewardConfig.model_fields.items():
        section = field.annotation
        found[f"[{name}]"] = section
        for key, inner in section.model_fields.items():
            args = getattr(inner.annotation, "__args__", ())
            if args and isinstance(args[0], type) and issubclass(args[0], BaseModel) \
                    and args[0] is not section:
                found[f"[[{name}.{key}]]"] = args[0]
    return found


def toml(value) -> str:
    return json.dumps(value) if isinstance(value, str | bool | list | dict) else repr(value)


def test_the_configuration_reference_lists_every_key_with_its_default():
    tables = documented()
    expected = models()
    assert set(tables) == set(expected), "sections: docs/configuration.md vs the models"
    for table, model in expected.items():
        keys = model.model_fields
        assert list(tables[table]) == list(keys), (
            f"{table}: documented {sorted(set(tables[table]) - set(keys))} not in the model; "
            f"missing {sorted(set(keys) - set(tables[table]))} (or out of order)")
        for key, field in keys.items():
            if field.default_factory is not None:
                default = field.default_factory()
            else:
                default = field.default
            cell = tables[table][key]
            if default is PydanticUndefined:
                assert cell == "required", (table, key, cell)
            elif default is None:  # computed or borrowed at load time: said in words
                assert cell and not cell.startswith("`"), (table, key, cell)
            else:
                assert cell == f"`{toml(default)}`", (table, key, cell, toml(default))


def test_the_example_config_and_the_reference_agree_on_the_sections():
    example = (REPO / "config.example.toml").read_text(encoding="utf-8")
    sections = set(re.findall(r"^#? ?(\[\w+\])", example, re.M))
    assert sections == {t for t in documented() if not t.startswith("[[")}, sections
