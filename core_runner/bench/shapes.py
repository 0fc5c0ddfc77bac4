"""Config-only benchmark shapes for ``core-runner bench --load-format dummy --shape NAME``: a
directory holding only a config.json, so a large model runs on random weights without
writing them (a 32B model's weights would be 64 GB to write).

* ``qwen3-0.6b`` / ``qwen3-32b``: the published Qwen3 shapes (``core_runner.bench.workloads``).
* ``deepseek-v3-mtp``: DeepSeek-V3's architecture with its published per-layer dims, shrunk
  in depth and expert count only so that it fits one H200 with room for the KV cache
  (``DEEPSEEK_V3_MTP``).
* ``qwen3-0.6b-fp8``: Qwen/Qwen3-0.6B-FP8, the 0.6B shape with block fp8 weights
  (``QWEN3_FP8_QUANTIZATION``); dummy loading makes them random fp8 values with positive
  block scales, resident in the layers (``core_runner.loader.dummy``).
* ``gemma-3-1b``: google/gemma-3-1b-pt's text config at full size (``GEMMA_3_1B``; five
  sliding-window layers to one global).
* ``mamba2-780m``: state-spaces/mamba2-780m (attention-free, ``MAMBA2_780M``).

Configs are plain dicts of config.json fields, as the bench must not import a family
plugin; the engine reads them through transformers' config classes. Field values were
written from the published config.json files without hub access: recheck them against
the hub before quoting a figure as that model's. ``shape_config(shape, **overrides)``
replaces fields (the smoke tests shrink sizes).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

SHAPES = ("qwen3-0.6b", "qwen3-32b", "deepseek-v3-mtp", "qwen3-0.6b-fp8", "gemma-3-1b", "mamba2-780m")

# Qwen/Qwen3-0.6B-FP8's quantization_config (fine-grained fp8, blocks of 128 x 128)
QWEN3_FP8_QUANTIZATION: dict[str, Any] = {
    "activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128],
    "modules_to_not_convert": ["lm_head"],
}

# google/gemma-3-1b-pt (Gemma3ForCausalLM, text only): layers 6, 12, 18, 24 global (pattern 6),
# the others attend over a window of 512 (the 4B / 12B / 27B models' window is 1,024: the
# gemma3 bench stage overrides it, as the issue asks). EOS / BOS left out: the bench ignores EOS.
GEMMA_3_1B: dict[str, Any] = {
    "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
    "vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "query_pre_attn_scalar": 256,
    "sliding_window": 512, "sliding_window_pattern": 6, "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "rms_norm_eps": 1e-6,
    "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False, "attn_logit_softcapping": None,
    "final_logit_softcapping": None, "tie_word_embeddings": True,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": 0,
}

# state-spaces/mamba2-780m as transformers' Mamba2Config: d_model 1536, 48 layers, heads of 64
# (48 = 2 x 1536 / 64), state 128, one group, vocab 50277 padded to 50288, tied head
MAMBA2_780M: dict[str, Any] = {
    "architectures": ["Mamba2ForCausalLM"], "model_type": "mamba2",
    "vocab_size": 50288, "hidden_size": 1536, "num_hidden_layers": 48, "num_heads": 48, "head_dim": 64,
    "state_size": 128, "n_groups": 1, "expand": 2, "conv_kernel": 4, "chunk_size": 256, "time_step_rank": 96,
    "hidden_act": "silu", "layer_norm_epsilon": 1e-5, "residual_in_fp32": True, "rescale_prenorm_residual": False,
    "time_step_floor": 1e-4, "time_step_limit": [0.0, float("inf")], "time_step_max": 0.1, "time_step_min": 0.001,
    "use_bias": False, "use_conv_bias": True, "tie_word_embeddings": True,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}
_DICT_SHAPES = {"gemma-3-1b": GEMMA_3_1B, "mamba2-780m": MAMBA2_780M}

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


def dict_config(fields: dict[str, Any]):
    """A transformers config of config.json ``fields`` (its ``model_type``'s class)."""
    from transformers import AutoConfig

    fields = dict(fields)
    architectures = fields.pop("architectures")
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    config.architectures = architectures
    return config


def shape_config(shape: str, **overrides: Any):
    """The transformers config of ``shape`` (one of ``SHAPES``), bf16; ``overrides`` replace fields."""
    from core_runner.bench.workloads import QWEN3_32B, qwen3_0p6b_config

    if shape == "qwen3-0.6b":
        config = qwen3_0p6b_config(**overrides)
    elif shape == "qwen3-32b":
        config = qwen3_0p6b_config(**{**QWEN3_32B, **overrides})
    elif shape == "qwen3-0.6b-fp8":
        config = qwen3_0p6b_config(**{"quantization_config": dict(QWEN3_FP8_QUANTIZATION), **overrides})
    elif shape == "deepseek-v3-mtp":
        config = deepseek_v3_mtp_config(**overrides)
    elif shape in _DICT_SHAPES:
        config = dict_config({**_DICT_SHAPES[shape], **overrides})
    else:
        raise ValueError(f"--shape {shape!r} is unknown: expected one of {list(SHAPES)}")
    config.dtype = "bfloat16"
    return config


def config_only_checkpoint(shape: str, root: str | Path | None = None, **overrides: Any) -> str:
    """A directory holding only ``shape``'s config.json (``overrides`` applied), for
    load_format='dummy' (under ``root``, default ``$CORE_RUNNER_CACHE`` or ~/.cache/core-runner)."""
    config = shape_config(shape, **overrides)
    if root is None:
        root = os.environ.get("CORE_RUNNER_CACHE", Path.home() / ".cache" / "core-runner")
    tag = ""
    if overrides:
        import hashlib
        import json

        tag = "-" + hashlib.blake2b(json.dumps(overrides, sort_keys=True, default=str).encode(),
                                    digest_size=4).hexdigest()
    path = Path(root) / f"bench-{shape}{tag}-config-only"
    path.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(path)
    return str(path)
