"""CR-SPEC-01/02 (speculative decoding changes no output; a row reused after it is fresh)
find what they are about: the Granite hybrid declared speculative_decoding supported
with its rollback skipped (tests/conformance_fixtures/hybrid_spec_no_rollback.py: its
Mamba state is not rolled back over rejected proposals) passes CR-EQ-01 and fails CR-SPEC-01 at a logits row after
a rejection; a state that keeps a row's offset from the request before
(tests/conformance_fixtures/spec_stale_row.py) fails CR-SPEC-02; the Qwen3 plugin as it
ships passes both on every example, and so does the Granite hybrid as it ships on its
tiny dense example."""
from __future__ import annotations

import importlib
import re

import pytest

from core_runner.conformance import run_suite
from core_runner.conformance.harness import LOGIT_ATOL
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


def test_qwen3_as_it_ships_passes_cr_spec_on_every_example():
    report = run_suite("qwen3", checks=["CR-SPEC"], tier="cpu")
    assert report["exit_code"] == 0, report["failing"]
    checks = report["checks"]
    assert sorted(c["name"] for c in checks if c["id"] == "CR-SPEC-01") == sorted(
        c["name"].replace("CR-SPEC-02", "CR-SPEC-01") for c in checks if c["id"] == "CR-SPEC-02")
    assert len(checks) == 18  # 4 Qwen3 (one fp8) and 2 Qwen3-MoE examples, three checks each
    # CR-SPEC-03 (the family's own draft) is not applicable: Qwen3 registers none
    assert all(c["outcome"].startswith("not run: not applicable") for c in checks if c["id"] == "CR-SPEC-03")
    checks = [c for c in checks if c["id"] != "CR-SPEC-03"]
    for c in checks:
        assert c["outcome"] == "passed"
        assert 0 <= c["max_logit_error"] <= LOGIT_ATOL
    for c in (c for c in checks if c["id"] == "CR-SPEC-01"):
        notes = " ".join(c["notes"])
        assert "default budget: accepted/proposed loop " in notes and "max_num_batched_tokens=8: " in notes, notes
        accepted, proposed = map(int, re.search(r"(\d+) of (\d+) proposed tokens accepted", notes).groups())
        assert 0 < accepted < proposed
    for c in (c for c in checks if c["id"] == "CR-SPEC-02"):
        # Zg's lookups match on every example; the cold seeded Zs's on most
        assert re.search(r"then Z Zg \d+/[1-9]\d*, Zs \d+/\d+ in row \d+", " ".join(c["notes"])), c["notes"]
    assert {r["speculative_decoding"]["observed"] for r in report["capabilities"].values()} == {"supported"}


def test_hybrid_as_it_ships_passes_cr_spec():
    report = run_suite("granite_hybrid", checks=["CR-SPEC-01", "CR-SPEC-02"], tier="cpu",
                       pytest_args=("-q", "-k", "GraniteMoeHybridForCausalLM and tiny-dense-nope"))
    checks = [c for c in report["checks"] if c["architecture"] == GRANITE]
    assert sorted(c["id"] for c in checks) == ["CR-SPEC-01", "CR-SPEC-02"], report["checks"]
    assert all(c["outcome"] == "passed" for c in checks), checks
