"""Issue 37 part 5, the state-reuse contract: CR-STATE-01 (reused row = fresh row) runs a
request to its end, fills its freed row (every row-state tensor, conv windows included)
with garbage, puts a request with a different prompt there and compares it with a fresh
engine, for every example of every family, those with row state included. A Granite
hybrid whose ModelState leaves the conv window of a reused row alone
(tests/conformance_fixtures/hybrid_conv_not_reset.py) fails it, while CR-EQ-01 passes."""
from __future__ import annotations

import importlib

import pytest

from core_runner.conformance import run_suite
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_granite_hybrid", reason="pip install -e plugins/granite_hybrid (requirements-dev)")


def test_conv_window_left_in_a_reused_row_fails_cr_state_01():
    pm = PluginManager()
    pm.register_module("hybrid_conv_not_reset", importlib.import_module("conformance_fixtures.hybrid_conv_not_reset"))
    report = run_suite("hybrid_conv_not_reset", pm=pm, checks=["CR-STATE-01", "CR-EQ-01"], tier="cpu")
    checks = {c["id"]: c for c in report["checks"]}
    assert report["exit_code"] == 1
    assert checks["CR-EQ-01"]["outcome"] == "passed"
    state = checks["CR-STATE-01"]
    assert state["outcome"] == "failed", report["checks"]
    assert "reused garbage-filled row" in state["message"], state["message"]
