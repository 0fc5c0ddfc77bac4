"""CR-SPEC-01/02 (speculative decoding changes no output; a row reused after it is fresh)
find what they are about: the Granite hybrid declared speculative_decoding supported
with its rollback skipped (tests/conformance_fixtures/hybrid_spec_no_rollback.py: its
Mamba state is not rolled back over rejected proposals) passes CR-EQ-01 and fails CR-SPEC-01 at a logits row after
a rejection; a state that keeps a row's offset from the request before
(tests/conformance_fixtures/spec_stale_row.py) fails CR-SPEC-02; the Qwen3 plugin as it
ships passes both on every example (checked on the background conformance run's report, in
tests/test_conformance_plugins.py), and so does the Granite hybrid as it ships on its tiny
dense example."""
from __future__ import annotations

import importlib
import re

import pytest

from core_runner.conformance import run_suite
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_granite_hybrid", reason="pip install -e plugins/granite_hybrid (requirements-dev)")
pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")

GRANITE = "GraniteMoeHybridForCausalLM"
FAILING = ("failed", "error")


def _fixture(name: str, checks: list[str]) -> dict:
    pm = PluginManager()
    pm.register_module(name, importlib.import_module(f"conformance_fixtures.{name}"))
    return run_suite(name, pm=pm, checks=checks, tier="cpu")


def _by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


def test_hybrid_that_keeps_its_state_over_rejected_proposals_fails_cr_spec_01():
    report = _fixture("hybrid_spec_no_rollback", ["CR-SPEC-01", "CR-EQ-01"])
    checks = _by_id(report)
    assert report["exit_code"] == 1
    assert checks["CR-EQ-01"]["outcome"] == "passed"  # without speculation the model is right
    spec = checks["CR-SPEC-01"]
    assert spec["outcome"] == "failed", report["checks"]
    found = re.search(r"default budget: (\S+) \((\d+)/(\d+) proposals accepted[^)]*\), speculation vs none: logits "
                      r"of output token (\d+): logits differ by (\S+) > 0.0001", spec["message"])
    assert found, spec["message"]
    accepted, proposed, token = int(found.group(2)), int(found.group(3)), int(found.group(4))
    assert accepted < proposed  # a proposal was rejected before the state went wrong
    assert token > 0  # the first output token comes from the prefill: right
    assert float(found.group(5)) > 1e-2
    assert report["capabilities"][GRANITE]["speculative_decoding"]["observed"] == "broken"


def test_state_left_by_a_speculative_request_fails_cr_spec_02():
    report = _fixture("spec_stale_row", ["CR-SPEC-02"])
    spec = _by_id(report)["CR-SPEC-02"]
    assert report["exit_code"] == 1 and spec["outcome"] == "failed", report["checks"]
    assert re.search(r"Zg in row \d+ after S \(speculative\) vs a fresh engine: (logits of output token 0: logits "
                     r"differ|token 0 is)", spec["message"]), spec["message"]


def test_hybrid_as_it_ships_passes_cr_spec():
    report = run_suite("granite_hybrid", checks=["CR-SPEC-01", "CR-SPEC-02"], tier="cpu",
                       pytest_args=("-q", "-k", "GraniteMoeHybridForCausalLM and tiny-dense-nope"))
    checks = [c for c in report["checks"] if c["architecture"] == GRANITE]
    assert sorted(c["id"] for c in checks) == ["CR-SPEC-01", "CR-SPEC-02"], report["checks"]
    assert all(c["outcome"] == "passed" for c in checks), checks
