"""The suite writes an example whose config declares fp8 block quantization as DeepSeek-V3
ships it (fp8 projections + weight_scale_inv, float32 embeddings / norms / router / lm_head),
with a reference that computes on the dequantized values; the engine matches it."""
from __future__ import annotations

import torch
from helpers import greedy, run
from safetensors import safe_open

from core_runner import LLM
from core_runner.conformance.harness import Reference, examples_of
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
