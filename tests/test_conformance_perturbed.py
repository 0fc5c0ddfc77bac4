"""CR-EQ-12 (perturbed config fields) and CR-EQ-13 (long positions) find bugs that the
registered examples hide: the Qwen3 plugin's model with a planted bug
(tests/conformance_fixtures/qwen3_bugs.py) fails under the new id, naming the field,
while CR-EQ-01 on the examples still passes; the model as it ships passes both."""
from __future__ import annotations

import importlib

import pytest

from core_runner.conformance import run_suite
from core_runner.conformance.harness import Example
from core_runner.conformance.variants import LONG_POSITIONS, long_position_example, perturbations
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")

FAILING = ("failed", "error", "xpassed (strict xfail: fails the run)")


def _suite(name: str, checks: list[str]) -> dict:
    pm = PluginManager()
    pm.register_module(name, importlib.import_module(f"conformance_fixtures.{name}"))
    return run_suite(name, pm=pm, checks=checks, tier="cpu")


def _by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


@pytest.mark.parametrize("fixture, culprit, evidence", [
    ("hardcoded_theta", "CR-EQ-12", "rope_parameters.rope_theta=1000000.0"),
    ("head_dim_from_hidden", "CR-EQ-12", "head_dim=32"),
    ("rope_cut_2048", "CR-EQ-13", "position 409"),
])
def test_bug_hidden_by_the_examples_fails_under_the_new_id(fixture, culprit, evidence):
    report = _suite(fixture, ["CR-EQ-01", culprit])
    checks = _by_id(report)
    assert report["exit_code"] == 1
    assert checks[culprit]["outcome"] == "failed", report["checks"]
    assert evidence in checks[culprit]["message"], checks[culprit]["message"]
    assert checks["CR-EQ-01"]["outcome"] == "passed"  # the registered example alone hides the bug
    if culprit == "CR-EQ-12":
        failed = [v["field"] for v in checks[culprit]["variants"] if v["outcome"] == "failed"]
        assert failed == [evidence.split("=")[0]], checks[culprit]["variants"]


def test_the_qwen3_model_as_it_ships_passes_and_the_report_lists_each_field():
    report = _suite("good_qwen3", ["CR-EQ-12", "CR-EQ-13"])
    assert report["exit_code"] == 0, report["failing"]
    checks = _by_id(report)
    assert {c["outcome"] for c in report["checks"]} == {"passed"}
    variants = {v["field"]: v for v in checks["CR-EQ-12"]["variants"]}
    for f in ("rope_parameters.rope_theta", "rms_norm_eps", "head_dim", "num_key_value_heads",
              "tie_word_embeddings", "attention_bias"):
        assert variants[f]["outcome"] == "passed", variants[f]
    assert variants["hidden_act"]["outcome"] == "refused by the plugin"
    assert all(c["duration_s"] > 0 for c in report["checks"])
    assert f"max_position_embeddings {LONG_POSITIONS}" in " ".join(checks["CR-EQ-13"]["notes"])


def _qwen3_registration():
    pm = PluginManager()
    pm.load_entry_points(["qwen3"])
    return pm.registry.get("Qwen3ForCausalLM")


def test_variants_move_each_field_away_from_example_and_default():
    reg = _qwen3_registration()
    from core_runner_qwen3.hooks import TINY

    example = Example("tiny", {**TINY, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-2})
    by_field = {v.field: v for v in perturbations(reg, example)}
    # the example already uses the first candidates: the variant takes the next one
    assert by_field["rope_parameters.rope_theta"].value == 500_000.0
    assert "rope_theta" not in by_field["rope_parameters.rope_theta"].example.config
    assert by_field["rms_norm_eps"].value == 2e-2
    assert by_field["head_dim"].value != TINY["hidden_size"] // TINY["num_attention_heads"]
    assert by_field["num_key_value_heads"].value == 1  # the proper divisor of 4 other than the example's 2
    assert by_field["tie_word_embeddings"].value is True  # Qwen3Config's default is False
    for v in by_field.values():
        assert v.example.config[v.field.split(".")[0]] != example.config.get(v.field.split(".")[0])


def test_kv_heads_variant_is_not_applicable_for_a_single_head():
    reg = _qwen3_registration()
    from core_runner_qwen3.hooks import TINY

    cfg = {**TINY, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64}
    kv = next(v for v in perturbations(reg, Example("one-head", cfg)) if v.field == "num_key_value_heads")
    assert kv.example is None and "num_attention_heads=1" in kv.reason


def test_long_example_raises_max_positions_only_when_smaller():
    reg = _qwen3_registration()
    from core_runner_qwen3.hooks import TINY

    raised, why = long_position_example(reg, Example("tiny", dict(TINY)))
    assert why is None and raised.config["max_position_embeddings"] == LONG_POSITIONS
    big, _ = long_position_example(reg, Example("big", {**TINY, "max_position_embeddings": 8192}))
    assert big.config["max_position_embeddings"] == 8192
