"""CR-EQ-12 (field sensitivity) and CR-EQ-13 (long positions) find bugs that the
registered examples hide: the Qwen3 plugin's model with a planted bug
(tests/conformance_fixtures/qwen3_bugs.py) fails under the new id, naming the field,
while CR-EQ-01 on the examples still passes; the model as it ships passes both. The
candidate values are derived from the config alone (no list of fields per family)."""
from __future__ import annotations

import importlib

import pytest

from core_runner.conformance import run_suite
from core_runner.conformance.harness import Example, Reference, examples_of, unchanged_tensors
from core_runner.conformance.variants import (
    LONG_POSITIONS,
    PROBE_LEN,
    SCALED_POSITIONS,
    WINDOW,
    dormant_groups,
    field_candidates,
    long_position_example,
    string_alternatives,
)
from core_runner.plugins import PluginManager, load_plugins

pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")

FAILING = ("failed", "error", "xpassed (strict xfail: fails the run)")


def _suite(name: str, checks: list[str]) -> dict:
    pm = PluginManager()
    pm.register_module(name, importlib.import_module(f"conformance_fixtures.{name}"))
    return run_suite(name, pm=pm, checks=checks, tier="cpu")


def _by_id(report: dict) -> dict[str, dict]:
    return {c["id"]: c for c in report["checks"]}


@pytest.mark.parametrize("fixture, culprit, evidence", [
    # hard-coded 10,000: the variant's logits equal the unperturbed reference's
    ("hardcoded_theta", "CR-EQ-12", "rope_parameters.rope_theta=15000.25: the reference's logits change, the "
                                    "plugin's do not"),
    ("head_dim_from_hidden", "CR-EQ-12", "head_dim=32"),
    # windows dropped and not refused: a windowed config runs full attention without a word
    ("window_undeclared", "CR-EQ-12", f"sliding_window={WINDOW}"),
    ("rope_cut_2048", "CR-EQ-13", "position 409"),
    # requests past 2,048 end in an error with no token: the check compares what it did not get no more
    ("fails_past_2048", "CR-EQ-13", "finish_reason='error'"),
])
def test_bug_hidden_by_the_examples_fails_under_the_new_id(fixture, culprit, evidence):
    report = _suite(fixture, ["CR-EQ-01", culprit])
    checks = _by_id(report)
    assert report["exit_code"] == 1
    assert checks[culprit]["outcome"] == "failed", report["checks"]
    assert evidence in checks[culprit]["message"], checks[culprit]["message"]
    assert checks["CR-EQ-01"]["outcome"] == "passed"  # the registered example alone hides the bug


def test_the_qwen3_model_as_it_ships_passes_and_the_report_lists_each_field():
    report = _suite("good_qwen3", ["CR-EQ-12", "CR-EQ-13"])
    assert report["exit_code"] == 0, report["failing"]
    checks = _by_id(report)
    assert {c["outcome"] for c in report["checks"]} == {"passed"}
    variants = {v["field"]: v for v in checks["CR-EQ-12"]["variants"]}
    for f in ("rope_parameters.rope_theta", "rope_parameters.rope_type", "rms_norm_eps", "head_dim",
              "num_key_value_heads", "tie_word_embeddings", "attention_bias", "num_hidden_layers", "vocab_size"):
        assert variants[f]["outcome"] == "passed", variants[f]
    assert variants["hidden_act"]["outcome"] == "refused by the plugin"
    # the window is switched on by three fields at once, and the plugin honours it
    window = variants["max_window_layers+sliding_window+use_sliding_window"]
    assert window["outcome"] == "passed", window
    assert all(c["duration_s"] > 0 for c in report["checks"])
    assert f"max_position_embeddings {LONG_POSITIONS}" in " ".join(checks["CR-EQ-13"]["notes"])


def _registration(arch: str):
    return load_plugins().registry.get(arch)


def test_every_config_field_gets_candidates_from_its_type_and_value():
    reg = _registration("Qwen3ForCausalLM")
    ex = examples_of(reg)[-1]
    by_field = {fc.field: fc for fc in field_candidates(reg, ex)}
    base = {**ex.config}
    # a bool flipped, a count moved far first, an eps raised, a window below the probe prompt (a None field
    # annotated int | None), a list of layer kinds rotated, a RoPE kind with the parameters it needs
    assert by_field["tie_word_embeddings"].tries[0] == (("tie_word_embeddings", not base["tie_word_embeddings"]),)
    assert by_field["num_hidden_layers"].tries[0] == (("num_hidden_layers", 2 * base["num_hidden_layers"]),)
    assert by_field["rms_norm_eps"].tries[0] == (("rms_norm_eps", 1e-2),)
    assert by_field["sliding_window"].tries[0] == (("sliding_window", WINDOW),) and WINDOW < PROBE_LEN
    assert by_field["layer_types"].tries[0][0][1] != ["full_attention"] * base["num_hidden_layers"]
    kinds = [t[0][1]["rope_type"] for t in by_field["rope_parameters.rope_type"].tries]
    assert {"linear", "yarn", "llama3"} <= set(kinds)
    # training-only and meta fields are not moved
    assert not {"initializer_range", "attention_dropout", "use_cache", "architectures"} & set(by_field)


def test_string_alternatives_come_from_the_reference_source():
    alts = string_alternatives(_registration("Qwen3ForCausalLM"))
    assert "sliding_attention" in alts.get("layer_type", set()) | alts.get("layer_types", set())
    pytest.importorskip("core_runner_deepseek", reason="pip install -e plugins/deepseek (requirements-dev)")
    reg = _registration("DeepseekV2ForCausalLM")
    tiny = next(e for e in examples_of(reg) if e.config.get("topk_method") == "group_limited_greedy")
    by_field = {fc.field: fc for fc in field_candidates(reg, tiny)}
    assert ("topk_method", "greedy") in [t[0] for t in by_field["topk_method"].tries]


def test_dormant_fields_that_share_a_word_are_moved_together():
    reg = _registration("Qwen3ForCausalLM")
    by_field = {fc.field: fc for fc in field_candidates(reg, examples_of(reg)[-1])}
    dormant = [by_field[f] for f in ("use_sliding_window", "sliding_window", "max_window_layers", "vocab_size")]
    groups = dormant_groups(dormant)
    assert [g.field for g in groups] == ["max_window_layers+sliding_window+use_sliding_window"]
    first = dict(groups[0].tries[0])
    assert first["use_sliding_window"] is True and first["sliding_window"] == WINDOW
    # a layer count past the model's layers is tried inside it as well
    assert any(dict(t)["max_window_layers"] < by_field["max_window_layers"].tries[0][0][1] for t in groups[0].tries)


def test_long_example_reaches_past_the_original_maximum_of_a_scaled_rope():
    reg = _registration("Qwen3ForCausalLM")
    from core_runner_qwen3.hooks import TINY

    raised, length, why = long_position_example(reg, Example("tiny", dict(TINY)))
    assert length == LONG_POSITIONS and raised.config["max_position_embeddings"] == LONG_POSITIONS
    big, length, _ = long_position_example(reg, Example("big", {**TINY, "max_position_embeddings": 8192}))
    assert big.config["max_position_embeddings"] == 8192 and length == LONG_POSITIONS
    yarn = {**TINY, "rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0,
                                        "original_max_position_embeddings": 8192}}
    yarn.pop("rope_theta")
    ex, length, why = long_position_example(reg, Example("yarn", yarn))
    assert length > 8192 and length >= SCALED_POSITIONS and "original_max_position_embeddings=8192" in why
    assert ex.config["max_position_embeddings"] == length


@pytest.mark.parametrize("arch", ["Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "GraniteMoeHybridForCausalLM",
                                  "BertModel"])
def test_reference_weights_leave_no_tensor_at_one_value(arch, tmp_path):
    """Zero biases, unit norms, a zero e_score_correction_bias (a buffer), D = 1: all moved."""
    pm = load_plugins()
    reg = pm.registry.find(arch)
    if reg is None:
        pytest.skip(f"{arch}'s plugin is not installed")
    for ex in examples_of(reg):
        ref = Reference(reg, ex, tmp_path)
        assert unchanged_tensors(ref.model) == [], (ex.name, unchanged_tensors(ref.model))
        if arch == "DeepseekV3ForCausalLM":
            names = [n for n, _ in ref.model.named_buffers() if n.endswith("e_score_correction_bias")]
            assert names, "the V3 router's correction bias is a saved buffer"


def test_a_variant_shares_its_base_weights_except_where_the_field_changes_them(tmp_path):
    reg = _registration("Qwen3ForCausalLM")
    ex = examples_of(reg)[0]
    base = Reference(reg, ex, tmp_path)
    cfg = dict(ex.config, rms_norm_eps=1e-2, tie_word_embeddings=True)
    other = Reference(reg, Example("eps", cfg), tmp_path, like=base)
    a, b = base.model.state_dict(), other.model.state_dict()
    assert all(bool((a[k] == b[k]).all()) for k in a if k != "lm_head.weight")
