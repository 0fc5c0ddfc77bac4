"""CR-EQ-12 moves each entry of a RoPE dict keyed by layer kind (Gemma3's
rope_parameters per layer type) on its own: a model whose sliding layers ignore their
own RoPE base passes CR-EQ-01 on an example that uses the usual base and fails CR-EQ-12
naming that entry; the candidates and the moved config say which entry moves."""
from __future__ import annotations

import importlib

import pytest

from core_runner.conformance import run_suite
from core_runner.conformance.harness import examples_of, reference_config
from core_runner.conformance.variants import field_candidates, variant
from core_runner.plugins import PluginManager, load_plugins

pytest.importorskip("core_runner_gemma", reason="pip install -e plugins/gemma (requirements-dev)")


def test_each_layer_kind_of_a_nested_rope_dict_is_moved_alone():
    reg = load_plugins(["gemma"]).registry.get("Gemma3ForCausalLM")
    example = next(e for e in examples_of(reg) if e.name == "tiny-linear-rope")
    by_field = {fc.field: fc for fc in field_candidates(reg, example)}
    for kind in ("full_attention", "sliding_attention"):
        assert f"rope_parameters.{kind}.rope_theta" in by_field and f"rope_parameters.{kind}.rope_type" in by_field
    assert "rope_parameters.full_attention.factor" in by_field  # the linear scaling's own parameter
    moved = variant(reg, example, by_field["rope_parameters.sliding_attention.rope_theta"].tries[0]).example
    params = reference_config(reg, moved).rope_parameters
    assert params["sliding_attention"]["rope_theta"] == 15000.25
    assert params["full_attention"] == example.config["rope_parameters"]["full_attention"]  # the other kind stays
    assert example.config["rope_parameters"]["sliding_attention"]["rope_theta"] == 10000.0  # the example is not written


def test_a_hard_coded_local_rope_base_fails_cr_eq_12():
    pm = PluginManager()
    pm.register_module("gemma3_local_theta", importlib.import_module("conformance_fixtures.gemma3_local_theta"))
    report = run_suite("gemma3_local_theta", pm=pm, checks=["CR-EQ-01", "CR-EQ-12"], tier="cpu")
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["CR-EQ-01"]["outcome"] == "passed"
    assert checks["CR-EQ-12"]["outcome"] == "failed"
    msg = checks["CR-EQ-12"]["message"]
    assert "rope_parameters.sliding_attention.rope_theta=15000.25: the reference's logits change" in msg, msg
    assert "rope_parameters.full_attention.rope_theta" not in msg  # the full layers honour theirs
