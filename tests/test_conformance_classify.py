"""CR-EQ-15 (core_runner/conformance/checks_classify.py): the pooling plugin's classifiers
(BERT: softmax, one-label sigmoid, multi-label sigmoid; Qwen3: softmax and one-label, with
chunk ends inside prompts) pass against transformers (checked on the background conformance
run's report, tests/test_conformance_plugins.py); a state whose activation flag goes
stale in reused rows (tests/conformance_fixtures/stale_activation.py) fails in the first
part that reuses a row."""
from __future__ import annotations

import importlib

import pytest

from core_runner.conformance import run_suite
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_pooling", reason="pip install -e plugins/pooling (requirements-dev)")


def test_a_stale_activation_flag_in_reused_rows_fails_cr_eq_15():
    pm = PluginManager()
    pm.register_module("stale_activation", importlib.import_module("conformance_fixtures.stale_activation"))
    (c,) = run_suite("stale_activation", pm=pm, checks=["CR-EQ-15"], tier="cpu")["checks"]
    assert c["outcome"] == "failed", c
    msg = c["message"]  # the first part that reuses a row (the chunked batches, whose short prompts end first)
    assert "probabilities differ from the reference" in msg and ("chunks of" in msg or "rows reused" in msg), msg


def test_reward_models_pass_cr_eq_16_and_forgotten_chunks_fail_it():
    report = run_suite("pooling", checks=["CR-EQ-16"], tier="cpu")
    cases = {c["name"]: c for c in report["checks"]}
    assert len(cases) == 3, sorted(cases)  # 2 Llama sequence reward examples, 1 per-token
    for name, c in cases.items():
        assert c["outcome"] == "passed", (name, c["message"])
    assert report["tasks"]["LlamaForTokenClassification"]["reward"]["observed"] == "supported"
    pm = PluginManager()
    pm.register_module("forgotten", importlib.import_module("conformance_fixtures.forgotten_reward_chunks"))
    (c,) = run_suite("forgotten", pm=pm, checks=["CR-EQ-16"], tier="cpu")["checks"]
    assert c["outcome"] == "failed" and "chunks of" in c["message"], c
