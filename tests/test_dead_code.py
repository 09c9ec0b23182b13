"""No dead code in Steward's modules: vulture at 60% confidence (the level that reports
unused methods, properties and attributes, not only unused imports and variables) finds
nothing, past what tests/dead_code_allowed.py lists as called from outside (a library's
callbacks) and what pydantic calls by its decorators. The tests are read too, so what only
they use (a store's test-facing reads) counts as used; only findings in the product's modules
are reported, and none in migrations (Alembic reads their module-level names), which are
read as users too."""

import subprocess
import sys

from tests.test_layers import ROOT

CONFIDENCE = 60


def test_vulture_finds_no_dead_code():
    found = subprocess.run(
        [sys.executable, "-m", "vulture", "bot", "connectors", "store", "tests", "bench",
         f"--min-confidence={CONFIDENCE}",
         "--ignore-decorators=@field_validator,@model_validator,@computed_field"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert found.stderr == ""
    product = [line for line in found.stdout.splitlines()
               if line.startswith(("bot/", "connectors/", "store/"))
               and not line.startswith("store/migrations/")]
    assert product == []
