"""Scaled RoPE end to end through the engine, against transformers (fp32, tiny models):
DeepSeek-V2 with DeepSeek-V2-Lite's YaRN rope_scaling (interleaved rope, YaRN softmax
scale) and Llama (the template plugin) with Llama-3.2-1B's llama3 rope. Every step's
logits within 1e-4 of transformers' full forwards, greedy tokens equal transformers'
generate, under chunked prefill."""
from __future__ import annotations

import pytest
import torch
from helpers import Checkpoint, Recorder, assert_logits_match_hf, greedy, hf_greedy, make_engine, random_prompts, run

V2_LITE_YARN = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
LLAMA32_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
NO_SPECIAL_IDS = dict(eos_token_id=None, bos_token_id=None, pad_token_id=None)

MODELS = {
    "deepseek-v2-yarn": ("DeepseekV2", dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0, max_position_embeddings=163840,
        rms_norm_eps=1e-6, initializer_range=0.12, tie_word_embeddings=False, rope_theta=10000.0,
        rope_scaling=V2_LITE_YARN, **NO_SPECIAL_IDS)),
    "llama-3.2-rope": ("Llama", dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=131072, rms_norm_eps=1e-5,
        initializer_range=0.12, rope_theta=500000.0, rope_scaling=LLAMA32_ROPE, tie_word_embeddings=True,
        **NO_SPECIAL_IDS)),
}


def build(root, name: str) -> Checkpoint:
    import transformers

    family, cfg = MODELS[name]
    config = getattr(transformers, f"{family}Config")(**{**cfg, "rope_scaling": dict(cfg["rope_scaling"])})
    assert config.rope_parameters["rope_type"] in ("yarn", "llama3")
    torch.manual_seed(5)
    hf = getattr(transformers, f"{family}ForCausalLM")(config).to(torch.float32).eval()
    path = root / name
    hf.save_pretrained(str(path))
    return Checkpoint(name=name, path=str(path), hf=hf)


@pytest.fixture(scope="module", params=list(MODELS))
def ckpt(request, tmp_path_factory, single_torch_thread):
    return build(tmp_path_factory.mktemp("rope_models"), request.param)


def test_logits_and_greedy_match_transformers(ckpt):
    engine = make_engine(ckpt, max_num_batched_tokens=16)  # the 40-token prompt prefills in chunks
    rec = Recorder(engine)
    prompts = random_prompts([3, 17, 40], seed=21)
    outs = run(engine, [(f"r{i}", p, greedy(10)) for i, p in enumerate(prompts)])
    assert assert_logits_match_hf(ckpt, rec, outs, atol=1e-4) >= len(prompts) * 10
    for i, p in enumerate(prompts):
        assert list(outs[f"r{i}"].token_ids) == hf_greedy(ckpt, p, 10), f"{ckpt.name} r{i}"
