"""The diagnosis appended to an equivalence failure (core_runner/conformance/diagnose.py)
names the first module that diverges from the reference and the modules that matched
before it: planted bugs in the Qwen3 and Qwen3-MoE plugins' models fail CR-EQ-01 naming
exactly the broken module; the alignment of module outputs works across the families
(fused residual layers of Qwen3 and DeepSeek MLA, Granite's Mamba / attention hybrid),
shown by a weight planted wrong in one module of the engine's model."""
from __future__ import annotations

import importlib
import re

import pytest
import torch

from core_runner.conformance import run_suite
from core_runner.conformance.diagnose import _compare, diagnose, explain
from core_runner.conformance.harness import Reference, examples_of
from core_runner.plugins import PluginManager

pytest.importorskip("core_runner_qwen3", reason="pip install -e plugins/qwen3 (requirements-dev)")

FIRST = re.compile(r"first divergence: ([\w.]+): max \|diff\| \S+ \(max \|ref\| [^)]*\) \(([^)]*) match\)")


def _first_and_matched(message: str) -> tuple[str, list[str]]:
    m = FIRST.search(message)
    assert m, message
    return m.group(1), m.group(2).split(", ")


@pytest.mark.parametrize("fixture, culprit, matched", [
    ("diverging_mlp", "model.layers.1.mlp",
     ["model.embed_tokens", "model.layers.0", "model.layers.1.self_attn", "model.layers.1.mlp.down_proj"]),
    ("diverging_router", "model.layers.2.mlp.gate",
     ["model.layers.0", "model.layers.1", "model.layers.2.self_attn", "model.layers.2.post_attention_layernorm"]),
])
def test_a_planted_bug_fails_cr_eq_01_naming_its_module(fixture, culprit, matched):
    pm = PluginManager()
    pm.register_module(fixture, importlib.import_module(f"conformance_fixtures.{fixture}"))
    check = run_suite(fixture, pm=pm, checks=["CR-EQ-01"], tier="cpu")["checks"][0]
    assert check["outcome"] == "failed", check
    msg = check["message"]
    assert msg.index("logits differ from the reference") < msg.index("diagnosis")  # the failure itself first
    first, ok = _first_and_matched(msg)
    assert first == culprit, msg
    assert set(matched) <= set(ok), msg
    assert not any(n == culprit or culprit.startswith(n + ".") for n in ok), msg  # nor an ancestor of it


# ---------------------------------------------------------------------------------
# diagnose() across families
# ---------------------------------------------------------------------------------
PLUGINS = {"qwen3": "core_runner_qwen3.hooks", "deepseek": "core_runner_deepseek.hooks",
           "granite_hybrid": "core_runner_granite_hybrid.hooks"}


def _case(tmp_path, plugin: str, architecture: str, example: str):
    pytest.importorskip(PLUGINS[plugin].split(".")[0], reason=f"pip install -e plugins/{plugin}")
    from core_runner import LLM

    pm = PluginManager()
    pm.register_module(plugin, importlib.import_module(PLUGINS[plugin]))
    reg = pm.registry.get(architecture)
    ref = Reference(reg, next(e for e in examples_of(reg) if e.name == example), tmp_path)
    engine = LLM(str(ref.path), plugins=pm, device="cpu", dtype="float32", max_model_len=64, max_num_seqs=1,
                 block_size=4, num_kv_blocks=16, max_num_batched_tokens=64).engine
    return ref, engine, ref.prompts([13], seed=3)[0]


def _plant(engine, module: str) -> None:
    """One module of the engine's model computes wrong: its weight is moved."""
    with torch.no_grad():
        engine.debug.model.get_submodule(module).weight.add_(0.5)


@pytest.mark.parametrize("plugin, architecture, example, broken, matched, fused", [
    # fused residual (layers return (x, residual)); the per-head q norm inside attention
    ("qwen3", "Qwen3ForCausalLM", "tiny-untied", "model.layers.1.self_attn.q_norm",
     ["model.layers.0", "model.layers.1.input_layernorm"], True),
    # MLA: the latent's norm, after the projections that match
    ("deepseek", "DeepseekV3ForCausalLM", "tiny", "model.layers.1.self_attn.kv_a_layernorm",
     ["model.layers.0", "model.layers.1.self_attn.q_b_proj", "model.layers.1.self_attn.kv_a_proj_with_mqa"], True),
    # Mamba / attention hybrid, plain residual layers: the mixer's gated norm in the third layer
    ("granite_hybrid", "GraniteMoeHybridForCausalLM", "tiny-moe-rope", "model.layers.2.mamba.norm",
     ["model.layers.0", "model.layers.1", "model.layers.2.mamba.in_proj"], False),
])
def test_alignment_across_families(tmp_path, plugin, architecture, example, broken, matched, fused):
    ref, engine, prompt = _case(tmp_path, plugin, architecture, example)
    right = diagnose(ref, engine, prompt)
    assert right.first_divergence is None, right.summary()
    assert "every aligned module matches" in right.summary()
    layers = [d for d in right.compared if re.fullmatch(r"model\.layers\.\d+", d.name)]
    assert len(layers) == len(ref.model.model.layers)  # every decoder layer was aligned
    assert all(("fused residual" in d.how) == fused for d in layers), [d.how for d in layers]
    assert {"model.embed_tokens", "model.norm", "lm_head"} <= {d.name for d in right.compared}

    _plant(engine, broken)
    wrong = diagnose(ref, engine, prompt)
    assert wrong.first_divergence is not None and wrong.first_divergence.name == broken, wrong.summary()
    first, ok = _first_and_matched(wrong.summary())
    assert first == broken and set(matched) <= set(ok), wrong.summary()


# ---------------------------------------------------------------------------------
# alignment rules and failure handling
# ---------------------------------------------------------------------------------
TOL = (1e-4, 1e-6)


def test_output_alignment_rules():
    x, res = torch.randn(5, 8), torch.randn(5, 8)
    ref = [(x + res)[None]]  # the reference layer: [1, seq, hidden], residual added
    d = _compare("layer", ref, [x, res], 5, TOL)
    assert d.max_diff == 0 and "fused residual" in d.how
    normed = torch.randn(5, 8)  # RMSNorm(x, residual) -> (normed, x + residual): the first counts
    d = _compare("norm", [normed[None]], [normed, x + res], 5, TOL)
    assert d.max_diff == 0 and d.how == "output"
    logits = torch.randn(5, 32)  # the engine computes logits for the last token only
    d = _compare("lm_head", [logits[None]], [logits[-1:]], 5, TOL)
    assert d.max_diff == 0 and "last token" in d.how
    heads = torch.randn(5, 4, 2)  # per-head outputs flatten per token; the router's tuple: its first tensor
    assert _compare("q_norm", [heads[None]], [heads], 5, TOL).max_diff == 0
    assert _compare("gate", [heads.reshape(5, 8), torch.ones(5, 2), torch.zeros(5, 2, dtype=torch.long)],
                    [heads.reshape(5, 8) + 1], 5, TOL).diverges
    # what cannot be aligned is a reason to skip, never a divergence
    assert isinstance(_compare("router", [torch.randn(5, 8)], [torch.randn(5, 2), torch.zeros(5, 2).long()], 5, TOL),
                      str)
    assert isinstance(_compare("ids", [torch.zeros(1, 5, dtype=torch.long)], [torch.zeros(5).long()], 5, TOL), str)


def test_a_broken_diagnosis_says_why_instead_of_raising():
    def no_engine(_max_len: int):
        raise RuntimeError("cannot build")

    text = explain(object(), no_engine, [3, 4, 5])
    assert text.startswith("diagnosis unavailable: RuntimeError: cannot build")
