"""A DeepSeek-V2-Lite-shaped random checkpoint for ``core-runner bench --model <path>``.

    python -m core_runner_deepseek.bench /tmp/v2lite          # bf16, on CUDA when present
    core-runner bench --model /tmp/v2lite --peer W1 W2        # (see benchmarks/gpu_check.sh)

The shape is DeepSeek-V2-Lite's (15.7B parameters, 2.4B active: 27 layers, hidden 2048,
16 heads, kv_lora_rank 512, rope 64, no q_lora, 64 routed experts of 1408 + 2 shared,
top-6 greedy routing, first layer dense). The real checkpoint uses YaRN rope scaling; the
random one keeps default RoPE (same cost: both are one precomputed cos/sin table).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch


def v2_lite_config(**overrides):
    from transformers import DeepseekV2Config

    cfg = dict(
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
        q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=64,
        n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1, topk_method="greedy",
        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False, max_position_embeddings=8192,
        rms_norm_eps=1e-6, rope_theta=10000.0, initializer_range=0.02, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    cfg.update(overrides)
    return DeepseekV2Config(**cfg)


def make_random_checkpoint(path: str | Path, config=None, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                           device: str | None = None) -> Path:
    """Random weights ~ N(0, initializer_range) (norms = 1), saved with per-expert tensors."""
    from transformers import DeepseekV2ForCausalLM

    config = config if config is not None else v2_lite_config()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config.dtype = dtype
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = DeepseekV2ForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    std = float(config.initializer_range)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=g)
    model.save_pretrained(str(path))
    return path


if __name__ == "__main__":
    print(make_random_checkpoint(sys.argv[1] if len(sys.argv) > 1 else "/tmp/deepseek_v2_lite_random"))
