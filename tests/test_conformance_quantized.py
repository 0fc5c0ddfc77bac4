"""The suite's fp8 checkpoints: an example whose config declares fp8 block quantization is
written as DeepSeek-V3 ships it (fp8 projections + weight_scale_inv, float32 embeddings /
norms / router / lm_head), with a reference that computes on the dequantized values, and
the engine matches it; CR-EQ-18's compressed-tensors checkpoints have the hub's layout,
its cases follow the declared methods, and a quantized lm_head loads (dense)."""
from __future__ import annotations

import json

import pytest
import torch
import transformers
from helpers import greedy, run
from safetensors import safe_open

from core_runner import LLM
from core_runner.conformance.harness import Reference, examples_of
from core_runner.conformance.quantized import write_quantized_checkpoint
from core_runner.plugins import load_plugins


def test_fp8_example_is_written_in_blocks_and_matches(tmp_path, single_torch_thread):
    reg = load_plugins(["deepseek"]).registry.get("DeepseekV3ForCausalLM")
    example = next(e for e in examples_of(reg) if "fp8" in e.name)
    ref = Reference(reg, example, tmp_path)
    with safe_open(str(ref.path / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        q_b = f.get_tensor("model.layers.0.self_attn.q_b_proj.weight")
        scale = f.get_tensor("model.layers.0.self_attn.q_b_proj.weight_scale_inv")
        assert f.get_tensor("lm_head.weight").dtype == torch.float32
        assert f.get_tensor("model.layers.1.mlp.gate.weight").dtype == torch.float32
    assert q_b.dtype == torch.float8_e4m3fn and scale.shape == (-(-q_b.shape[0] // 16), -(-q_b.shape[1] // 16))
    assert "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv" in names
    llm = LLM(str(ref.path), device="cpu", dtype="float32", max_model_len=128, max_num_seqs=4, num_kv_blocks=64)
    prompt = [5, 17, 42, 7, 99, 3]
    out = run(llm.engine, [("a", prompt, greedy(6))])["a"]
    assert out.token_ids == ref.greedy(prompt, 6)


# ---- CR-EQ-18's checkpoints, generation and the lm_head -------------------------------
def _qwen3_ref(tmp_path):
    reg = load_plugins(["qwen3"]).registry.get("Qwen3ForCausalLM")
    example = next(e for e in examples_of(reg) if e.name == "tiny-untied")
    return reg, Reference(reg, example, tmp_path)


def _tensors(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


@pytest.mark.parametrize("strategy", ["tensor", "channel"])
def test_compressed_tensors_checkpoint_has_the_hub_layout(tmp_path, single_torch_thread, strategy):
    """llm-compressor's layout: e4m3 'weight' + float32 'weight_scale' ([1] per tensor,
    [out, 1] per channel), unquantized embeddings / norms / lm_head, and a quantization_config
    the compressed-tensors library parses back to the same scheme; the values are the
    library's own quantization (dequantized = fp8 x scale, within fp8 rounding of the original)."""
    from compressed_tensors.quantization import QuantizationConfig

    reg, base = _qwen3_ref(tmp_path)
    src = _tensors(base.path)
    path = tmp_path / f"ct-{strategy}"
    model, names = write_quantized_checkpoint(base.path, path, transformers.Qwen3ForCausalLM, f"ct-{strategy}")
    got = _tensors(path)
    w = "model.layers.0.self_attn.q_proj.weight"
    assert w in names and "lm_head.weight" not in names and got[w].dtype == torch.float8_e4m3fn
    scale = got[w + "_scale"]
    assert scale.dtype == torch.float32 and tuple(scale.shape) == ((1,) if strategy == "tensor" else (64, 1))
    assert got["lm_head.weight"].dtype == got["model.embed_tokens.weight"].dtype == torch.float32
    assert got["model.layers.0.input_layernorm.weight"].dtype == torch.float32
    deq = got[w].float() * scale
    assert torch.equal(model.state_dict()[w], deq)  # the reference computes with exactly these values
    assert (deq - src[w]).abs().max() <= src[w].abs().max() / 8  # e4m3 keeps 3 mantissa bits
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    parsed = QuantizationConfig.model_validate(qc)
    assert qc["quant_method"] == "compressed-tensors" and parsed.format == "float-quantized"
    assert parsed.config_groups["group_0"].weights.strategy == strategy and "lm_head" in parsed.ignore


def test_cr_eq_18_is_generated_per_declared_quantization_method():
    from core_runner.conformance import catalog
    from core_runner.conformance.session import ConformanceSession

    session = ConformanceSession("deepseek")
    session.selected = catalog.select(["CR-EQ-18"])
    session._load()
    labels = sorted(c.label for c in session.cases())
    assert labels == [f"{a}:quantization:{m}" for a in ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
                      for m in ("compressed-tensors", "fp8")]


def test_undeclared_method_is_refused_inside_cr_eq_18(single_torch_thread):
    """A family declaring fp8 only: its one CR-EQ-18 case passes, and among its refusals is a
    real compressed-tensors checkpoint raising UnsupportedError naming the capability."""
    import importlib

    from core_runner.conformance import run_suite
    from core_runner.plugins import PluginManager

    pm = PluginManager()
    pm.register_module("quant_fp8_only", importlib.import_module("conformance_fixtures.quant_fp8_only"))
    report = run_suite("quant_fp8_only", pm=pm, checks=["CR-EQ-18"], tier="cpu")
    (case,) = report["checks"]
    assert case["name"] == "CR-EQ-18[Qwen3ForCausalLM:quantization:fp8]" and case["outcome"] == "passed", case
    assert any("3 unsupported schemes refused" in n for n in case["notes"]), case["notes"]


def test_fp8_lm_head_stays_resident_and_matches(tmp_path, single_torch_thread):
    """A checkpoint that quantizes lm_head too (the published ones do not): the head keeps its
    fp8 values and scales (ParallelLMHead, docs/quantization.md) as the projections do, and
    the logits are the reference's on the dequantized weights."""
    import re

    from core_runner.layers import is_fp8

    reg, base = _qwen3_ref(tmp_path)
    keep = re.compile(r"(embed_tokens|norm|layernorm)\.weight$")
    path = tmp_path / "fp8-head"
    model, names = write_quantized_checkpoint(base.path, path, transformers.Qwen3ForCausalLM, "fp8-block", keep=keep)
    assert "lm_head.weight" in names and _tensors(path)["lm_head.weight"].dtype == torch.float8_e4m3fn
    llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=64, max_num_seqs=2, num_kv_blocks=32)
    m = llm.engine.debug.model
    from core_runner.layers import dense_weight

    assert is_fp8(m.lm_head) and m.lm_head.weight.dtype == torch.float8_e4m3fn
    assert is_fp8(m.model.layers[0].self_attn.o_proj)
    assert torch.equal(dense_weight(m.lm_head), model.lm_head.weight)
    ref = base.with_checkpoint(model, path)
    prompt = [5, 17, 42, 7, 99, 3]
    assert run(llm.engine, [("a", prompt, greedy(6))])["a"].token_ids == ref.greedy(prompt, 6)


@pytest.mark.parametrize(("plugin", "dense"), [("mamba", None), ("gpt_oss", "mlp.experts.w13")])
def test_cr_eq_18_residency_per_family(plugin, dense, single_torch_thread):
    """Mamba2's packed in_proj keeps its fp8 parts (nothing dense by construction); gpt-oss's
    stacked experts are the one part dequantized at load, and the report says so."""
    from core_runner.conformance import run_suite

    report = run_suite(plugin, checks=["CR-EQ-18"], tier="cpu")
    assert report["checks"] and all(c["outcome"] == "passed" for c in report["checks"]), report["checks"]
    notes = [n for c in report["checks"] for n in c["notes"] if "resident fp8" in n]
    assert notes and all(("dense by construction" in n) == ("fp8-block" in n and dense is not None) for n in notes)
    if dense:
        assert any(dense in n for n in notes), notes
