"""CR-EQ-09 (prefix cache on = off) finds a model whose state ignores the cached prefix:
a Granite hybrid whose state ignores the snapshot of a hit
(tests/conformance_fixtures/hybrid_cached_prefix.py: its ModelState ignores the state
snapshot) passes CR-EQ-01 and fails CR-EQ-09
at the first position computed after a hit, while the Qwen3 plugin and the Granite hybrid
(row-state snapshots) as they ship pass with every kind of hit the check scripts."""
from __future__ import annotations

import importlib
import re

import pytest

from core_runner.conformance import run_suite
from core_runner.conformance.checks_prefix import SAME_ATOL
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_granite_hybrid", reason="pip install -e plugins/granite_hybrid (requirements-dev)")
pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")

GRANITE = "GraniteMoeHybridForCausalLM"


def _by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def test_hybrid_that_restarts_its_state_on_a_hit_fails_cr_eq_09():
    pm = PluginManager()
    pm.register_module("hybrid_cached_prefix", importlib.import_module("conformance_fixtures.hybrid_cached_prefix"))
    report = run_suite("hybrid_cached_prefix", pm=pm, checks=["CR-EQ-09", "CR-EQ-01"], tier="cpu")
    checks = _by_id(report)
    assert report["exit_code"] == 1
    assert checks["CR-EQ-01"]["outcome"] == "passed"  # without hits the model is right
    eq = checks["CR-EQ-09"]
    assert eq["outcome"] == "failed", report["checks"]
    # B repeats A's 25-token prompt: 24 tokens come from the cache, position 24 is computed
    # from a Mamba state restarted at zero
    found = re.search(r"B \(24 cached tokens\), prefix cache on vs off: logits of position 24: logits differ by "
                      r"(\S+) > 1e-05", eq["message"])
    assert found, eq["message"]
    assert float(found.group(1)) > 1e-3
    assert report["capabilities"][GRANITE]["prefix_caching"]["observed"] == "broken"


def test_qwen3_as_it_ships_passes_cr_eq_09_with_every_kind_of_hit():
    report = run_suite("qwen3", checks=["CR-EQ-09"], tier="cpu")
    assert report["exit_code"] == 0, report["failing"]
    assert len(report["checks"]) == 2  # Qwen3 and Qwen3-MoE
    for eq in report["checks"]:
        assert eq["outcome"] == "passed"
        assert 0 <= eq["max_logit_error"] <= SAME_ATOL
        notes = " ".join(eq["notes"])
        for where in ("default budget", "max_num_batched_tokens=8"):
            # A none; B up to its last block; C, D the shared prefix; E also 2 blocks of A's output
            assert f"{where}: hits [0, 24, 20, 20, 28] tokens for ['A', 'B', 'C', 'D', 'E']" in notes, notes
        assert notes.count("B resumed from 24 cached tokens") == 2, notes


def test_hybrid_as_it_ships_passes_cr_eq_09():
    report = run_suite("granite_hybrid", checks=["CR-EQ-09"], tier="cpu", pytest_args=("-q", "-k", "GraniteMoeHybrid"))
    assert report["exit_code"] == 0, report["failing"]
    eq = next(c for c in report["checks"] if c["name"] == f"CR-EQ-09[{GRANITE}:prefix_caching]")
    assert eq["outcome"] == "passed" and 0 <= eq["max_logit_error"] <= SAME_ATOL
    notes = " ".join(eq["notes"])
    for where in ("default budget", "max_num_batched_tokens=8"):
        assert f"{where}: hits [0, 24, 20, 20, 28] tokens for ['A', 'B', 'C', 'D', 'E']" in notes, notes
