"""The layers import only downwards: `bot/app` (the composition root) -> connectors -> the
rest of `bot` -> `store`. Read from the source (every import, also those inside functions),
so a lazy import cannot slip past."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What a connector may import from the core: the port and the channel contract, the
# config's base model, the import record its history reader produces, and a few leaf
# helpers where they live (the crash hook, the home's permissions, attachment limits, the
# timezone check).
CONNECTOR_MAY_USE = ("bot.port", "bot.channels", "bot.config", "bot.importers.model",
                     "bot.runtime.killpoints", "bot.home", "bot.attachments",
                     "bot.tools.base")
BELOW_AGENT = ("bot.memory", "bot.tools", "bot.llm", "bot.runtime", "bot.importers")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in the file."""
    tree = ast.parse(source if source is not None else path.read_text(), str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names] if not node.module else [base]
            found += [(node.lineno, n) for n in names]
    return found


def under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def connector_of(module: str) -> str | None:
    """`connectors.slack.inbound` -> `connectors.slack`; `connectors.terminal` is one too."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "connectors" and len(parts) > 1 else None


def violations(path: Path, source: str | None = None) -> list[str]:
    me = module_name(path)
    bad = []
    for line, target in imports(path, source):
        why = None
        if under(me, "store"):
            if any(under(target, p) for p in ("bot", "connectors")):
                why = "the store imports nothing above it"
        elif under(me, "connectors"):
            mine = connector_of(me)
            if under(target, "store"):
                why = "a connector talks to the agent through bot.port, never to the store"
            elif connector_of(target) not in (None, mine):
                why = "connectors never import each other"
            elif under(target, "bot") and not any(under(target, p) for p in CONNECTOR_MAY_USE):
                why = f"a connector imports from the core only {', '.join(CONNECTOR_MAY_USE)}"
        elif under(me, "bot") and not under(me, "bot.app") and me != "bot.__main__":
            # (`python -m bot` launches the root's CLI: the one way in from the top)
            if under(target, "connectors") or under(target, "bot.app"):
                why = "only bot/app (the composition root) knows the connectors"
            elif any(under(me, low) for low in BELOW_AGENT) and under(target, "bot.agent"):
                why = "memory, tools, the models' clients and the runtime sit below the agent"
        if why:
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {target}: {why}")
    return bad


def sources() -> list[Path]:
    return sorted(p for top in ("bot", "connectors", "store") for p in (ROOT / top).rglob("*.py")
                  if "migrations" not in p.parts)


def test_every_layer_imports_only_downwards():
    found = [v for path in sources() for v in violations(path)]
    assert found == []


@pytest.mark.parametrize("file, source, flagged", [
    ("store/x.py", "from bot.agent import turn", True),
    ("store/x.py", "from store.errors import StoreError", False),
    ("connectors/slack/x.py", "from store import Writes", True),
    ("connectors/slack/x.py", "def f():\n    import store.engine", True),
    ("connectors/slack/x.py", "from connectors.email import parse", True),
    ("connectors/slack/x.py", "from bot.agent.inbox import submit_message", True),
    ("connectors/slack/x.py", "from . import routing\nfrom bot.port import AgentPort", False),
    ("connectors/email/x.py", "from ..slack import routing", True),
    ("bot/agent/x.py", "from connectors.slack.routing import CHANNEL", True),
    ("bot/memory/x.py", "from bot.app.wiring import open_app", True),
    ("bot/memory/x.py", "from bot.agent.context import PAGE", True),
    ("bot/agent/x.py", "from bot.memory.transcript import PAGE", False),
    ("bot/app/x.py", "from connectors.email.mbox import MboxReader", False),
])
def test_the_rules_catch_what_they_forbid(file, source, flagged):
    assert bool(violations(ROOT / file, source)) is flagged
