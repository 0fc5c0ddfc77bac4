"""Config-only benchmark shapes for ``core-runner bench --load-format dummy --shape NAME``: a
directory holding only a config.json, so a large model runs on random weights without
writing them (a 32B model's weights would be 64 GB to write).

* ``qwen3-0.6b`` / ``qwen3-32b``: the published Qwen3 shapes (``core_runner.bench.workloads``).
* ``deepseek-v3-mtp``: DeepSeek-V3's architecture with its published per-layer dims, shrunk
  in depth and expert count only so that it fits one H200 with room for the KV cache
  (``DEEPSEEK_V3_MTP``).

The DeepSeek config is a plain dict of config.json fields, as the bench must not import a
family plugin; the engine reads it through transformers' ``DeepseekV3Config``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SHAPES = ("qwen3-0.6b", "qwen3-32b", "deepseek-v3-mtp")

# deepseek-ai/DeepSeek-V3's config.json with two kinds of cuts, every other field published:
#   num_hidden_layers 61 -> 12 (first_k_dense_replace 3 kept: 3 dense + 9 MoE layers), and
#   n_routed_experts 256 -> 32 (n_group 8 / topk_group 4 kept: 4 experts per group, top-8 of
#   the 16 in the 4 best groups), plus its one next-token-prediction (MTP) layer, 12.
# Weights are bf16 (published: fp8 blocks of 128): no quantization_config, so that the
# comparison with and without MTP is not also one of fp8 kernels. One 7168-wide expert
# (gate, up, down of 2048) is 44.0M parameters, 88 MB in bf16, so a MoE layer of 256 would
# be 22.5 GB; with 32 routed + 1 shared it is 2.9 GB, plus 0.37 GB of MLA attention
# (q_a 7168x1536, q_b 1536x128x192, kv_a 7168x576, kv_b 512x128x256, o 16384x7168).
# Parameters: embed + lm_head 2 x 0.93B, 3 dense layers 3 x 0.58B, 9 MoE layers 9 x 1.64B,
# the MTP layer (a MoE layer + eh_proj 14336x7168, embedding and head shared with the
# target) 1.74B: 18.37B for the target (36.7 GB in bf16; tests/test_bench_spec.py counts it
# on the meta device) and ~20.1B, ~40.2 GB with the MTP layer, leaving ~80 GB of an H200 for
# the KV cache and activations. MLA caches (512 + 64) x 2 bytes per token and layer: ~15 KB
# per token over the 13 layers (the MTP layer's included).
DEEPSEEK_V3_MTP: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 12,  # published: 61
    "first_k_dense_replace": 3,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 32,  # published: 256
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "moe_layer_freq": 1,
    "hidden_act": "silu",
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 163840,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                        "original_max_position_embeddings": 4096},
    "rope_interleave": True,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    # the published ids (0 / 1) would stop random outputs early; EOS is ignored by the bench anyway
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def deepseek_v3_mtp_config(**overrides: Any):
    """A ``transformers.DeepseekV3Config`` of ``DEEPSEEK_V3_MTP``; keyword arguments override
    fields (the tests shrink it to run on a CPU)."""
    from transformers import DeepseekV3Config

    fields = {**DEEPSEEK_V3_MTP, **overrides}
    architectures = fields.pop("architectures")
    fields.pop("model_type")
    config = DeepseekV3Config(**fields)
    config.architectures = architectures
    return config


def shape_config(shape: str):
    """The transformers config of ``shape`` (one of ``SHAPES``), bf16."""
    from core_runner.bench.workloads import QWEN3_32B, qwen3_0p6b_config

    if shape == "qwen3-0.6b":
        config = qwen3_0p6b_config()
    elif shape == "qwen3-32b":
        config = qwen3_0p6b_config(**QWEN3_32B)
    elif shape == "deepseek-v3-mtp":
        config = deepseek_v3_mtp_config()
    else:
        raise ValueError(f"--shape {shape!r} is unknown: expected one of {list(SHAPES)}")
    config.dtype = "bfloat16"
    return config


def config_only_checkpoint(shape: str, root: str | Path | None = None) -> str:
    """A directory holding only ``shape``'s config.json, for load_format='dummy' (under
    ``root``, default ``$CORE_RUNNER_CACHE`` or ~/.cache/core-runner)."""
    config = shape_config(shape)
    if root is None:
        root = os.environ.get("CORE_RUNNER_CACHE", Path.home() / ".cache" / "core-runner")
    path = Path(root) / f"bench-{shape}-config-only"
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    return str(path)
