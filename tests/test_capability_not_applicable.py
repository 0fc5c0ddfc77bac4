"""The capability state "not applicable: <reason>" (registry.MAY_NOT_APPLY: triton_attention
only): for a model without attention layers the oracle neither downgrades nor refuses the
attention backend (which is never called), and the conformance suite checks the claim (no
paged KV cache) instead of the feature, on any tier."""
from __future__ import annotations

import importlib

import pytest

from core_runner.config import EngineConfig
from core_runner.oracle import UnsupportedError, plan_execution
from core_runner.registry import Capability, Registry

pytest.importorskip("core_runner_llama_template", reason="pip install -e examples/plugin_template (requirements-dev)")


def test_parse():
    cap = Capability.parse("triton_attention", "not applicable: attention-free")
    assert (cap.state, cap.reason, cap.supported, cap.not_applicable) == ("not applicable", "attention-free",
                                                                         False, True)
    with pytest.raises(ValueError, match="only triton_attention, kv_cache_dtype:fp8 may be declared 'not applicable'"):
        Capability.parse("cuda_graphs", "not applicable: no graphs")
    with pytest.raises(ValueError, match="is invalid"):
        Capability.parse("triton_attention", "not applicable")  # a reason is required


def _registration(state: str):
    reg = Registry()
    reg.add("X", "m:X", "s:X", capabilities={"cuda_graphs": "supported", "async_scheduling": "supported",
                                             "triton_attention": state})
    return reg.get("X")


def test_oracle_does_not_downgrade_an_attention_backend_that_cannot_apply():
    pytest.importorskip("triton")
    cfg = EngineConfig(model="/nonexistent", device="cuda", dtype="float32", strict=True)
    plan = plan_execution(cfg, _registration("not applicable: attention-free"))
    assert plan.attention_backend == "triton" and plan.cuda_graphs and not plan.downgrades
    # unsupported would cost the graphs (the torch backend is not graph-capable): a strict error
    with pytest.raises(UnsupportedError, match="Triton attention off"):
        plan_execution(cfg, _registration("unsupported"))


def _suite(name: str, checks: list[str]) -> dict:
    from core_runner.conformance import run_suite
    from core_runner.plugins import PluginManager

    pm = PluginManager()
    pm.register_module(name, importlib.import_module(f"conformance_fixtures.{name}"))
    return run_suite(name, pm=pm, checks=checks, tier="cpu")


def test_suite_refuses_a_false_claim():
    report = _suite("attention_not_applicable", ["CR-EQ-01", "CR-EQ-08", "CR-BOUND-05"])
    by_name = {c["name"]: c for c in report["checks"]}
    assert by_name["CR-EQ-01[LlamaForCausalLM:tiny]"]["outcome"] == "passed"
    for name in ("CR-EQ-08[LlamaForCausalLM:triton_attention]", "CR-BOUND-05[LlamaForCausalLM:triton_attention]"):
        assert by_name[name]["outcome"] == "failed", by_name[name]
        assert "declared not applicable" in by_name[name]["message"] and "paged attention" in by_name[name]["message"]
    assert report["capabilities"]["LlamaForCausalLM"]["triton_attention"]["observed"] == "broken"


def test_suite_confirms_a_true_claim():
    pytest.importorskip("core_runner_mamba", reason="pip install -e plugins/mamba (requirements-dev)")
    from core_runner.conformance import run_suite

    report = run_suite("mamba", checks=["CR-EQ-08", "CR-BOUND-05"], tier="cpu")
    ta = report["capabilities"]["Mamba2ForCausalLM"]["triton_attention"]
    assert ta["declared"] == "not applicable"
    assert ta["observed"].startswith("not run: not applicable: attention-free"), ta
    assert report["outcome"] == "passed", report["failing"]
