"""Proof that the conformance suite catches real bugs: deliberately broken plugins
(tests/conformance_fixtures/), registered directly into a PluginManager, must fail under
the right check id, and the correct variant of the same machinery must pass.

Each run is the suite's own pytest session, in this process (``run_suite``), limited to
the checks that matter so that it stays fast."""
from __future__ import annotations

import importlib

import pytest

from core_runner.conformance import run_suite
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_llama_template", reason="pip install -e examples/plugin_template (requirements-dev)")

FAILING = ("failed", "error", "xpassed (strict xfail: fails the run)")


def _suite(name: str, checks: list[str]) -> dict:
    pm = PluginManager()
    pm.register_module(name, importlib.import_module(f"conformance_fixtures.{name}"))
    return run_suite(name, pm=pm, checks=checks, tier="cpu", machine_examples=4)


def _by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


@pytest.mark.parametrize("fixture, checks, culprit, evidence", [
    # a ModelState that does not reset a reused row
    ("stale_row", ["CR-STATE-01", "CR-EQ-01"], "CR-STATE-01", "reused garbage-filled row"),
    # a dummy run that writes state
    ("dummy_writes", ["CR-STATE-02", "CR-EQ-01"], "CR-STATE-02", "model_state.offset"),
    # an option that is silently ignored (dtype)
    ("ignores_dtype", ["CR-BOUND-04", "CR-EQ-01"], "CR-BOUND-04", "dtype='bfloat16'"),
    # a per-request setting (the logprob count) lost on preemption
    ("lossy_params", ["CR-STATE-03", "CR-EQ-01"], "CR-STATE-03", "preempt"),
])
def test_broken_plugin_fails_under_its_check_id(fixture, checks, culprit, evidence):
    report = _suite(fixture, checks)
    checks_by_id = _by_id(report)
    assert report["exit_code"] == 1 and report["outcome"] == "failed"
    failed = {i for i, c in checks_by_id.items() if c["outcome"] in FAILING}
    assert failed == {culprit}, f"{fixture}: failing checks {failed}, expected only {culprit}: {report['checks']}"
    assert evidence in checks_by_id[culprit]["message"], checks_by_id[culprit]["message"]
    assert checks_by_id["CR-EQ-01"]["outcome"] == "passed"  # the model itself is right


def test_wrong_embeddings_fail_cr_eq_10():
    pytest.importorskip("core_runner_pooling", reason="pip install -e plugins/pooling (requirements-dev)")
    report = _suite("wrong_pooling", ["CR-EQ-10", "CR-EQ-11"])
    checks_by_id = _by_id(report)
    assert checks_by_id["CR-EQ-10"]["outcome"] == "failed", report["checks"]
    assert "embedding differs" in checks_by_id["CR-EQ-10"]["message"]
    # consistent across schedules, but CR-EQ-11 compares with the reference too
    assert checks_by_id["CR-EQ-11"]["outcome"] == "failed", report["checks"]
    assert "differs from the reference" in checks_by_id["CR-EQ-11"]["message"]


def test_state_machine_finds_a_stale_row_and_prints_the_steps():
    report = _suite("stale_row", ["CR-STATE-06"])
    machine = _by_id(report)["CR-STATE-06"]
    assert machine["outcome"] == "failed"
    msg = machine["message"]
    # Hypothesis < 6.16x says "Falsifying example", newer versions "Failing test case"
    assert ("Falsifying example" in msg or "Failing test case" in msg) and "state.add(" in msg


def test_correct_variant_of_the_same_state_passes():
    report = _suite("good_offsets", ["CR-STATE-01", "CR-STATE-02", "CR-STATE-03", "CR-STATE-04", "CR-STATE-06",
                                     "CR-EQ-04"])
    assert report["exit_code"] == 0, report["failing"]
    assert {c["outcome"] for c in report["checks"]} == {"passed"}
    notes = " ".join(_by_id(report)["CR-STATE-01"]["notes"])
    assert "model_state.offset" in notes  # its row buffer was garbage-filled


def test_xfail_that_passes_fails_the_run():
    report = _suite("xfail_passes", ["CR-EQ-02", "CR-BOUND-05"])
    assert report["exit_code"] == 1
    eq = _by_id(report)["CR-EQ-02"]
    assert eq["outcome"] == "xpassed (strict xfail: fails the run)" and eq["declared"] == "xfail"
    chunked = report["capabilities"]["LlamaForCausalLM"]["chunked_prefill"]
    assert chunked["declared"] == "xfail" and chunked["observed"] == "passes: declare it supported"
    # enabling it is still refused by the engine, as for an unsupported capability
    refused = [c for c in report["checks"] if c["name"] == "CR-BOUND-05[LlamaForCausalLM:chunked_prefill]"]
    assert refused and refused[0]["outcome"] == "passed"


def test_plugin_registering_nothing_is_an_error_not_a_skip():
    report = run_suite(module="conformance_fixtures.registers_nothing", checks=["CR-REG-01"], tier="cpu")
    assert report["exit_code"] == 1
    reg = _by_id(report)["CR-REG-01"]
    assert reg["outcome"] == "failed" and "registered no architecture" in reg["message"]


def test_missing_entry_point_is_an_error_not_a_skip():
    report = run_suite("no_such_core_runner_plugin", checks=["CR-REG-01"], tier="cpu")
    assert report["exit_code"] == 1
    reg = _by_id(report)["CR-REG-01"]
    assert reg["outcome"] == "failed" and "not found" in reg["message"]


def test_clash_with_an_installed_plugin_fails_the_override_check():
    # the fixtures register LlamaForCausalLM without override=True, as does llama_template
    report = run_suite(module="conformance_fixtures.good_offsets", checks=["CR-REG-04"], tier="cpu")
    reg = _by_id(report)["CR-REG-04"]
    assert reg["outcome"] == "failed" and "already registered by plugin 'llama_template'" in reg["message"]
