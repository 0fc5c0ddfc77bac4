"""Weight bytes of a DeepSeek-V3-shaped model, fp8 resident vs bf16 (issue 39 part 3).

Built on the meta device with fake tensors (``core_runner.loader.footprint``), so it runs
anywhere in about a second: the published DeepSeek-V3 sizes with fewer layers (3 dense +
N MoE layers; default 4 layers, ``--layers``), once dense in bf16 and once built for its
fp8 checkpoint (``weight_block_size`` [128, 128]: fp8 weights + float32 block scales;
embeddings, norms, routers, lm_head and MLA's kv_b_proj stay bf16). Prints one JSON line.

    python benchmarks/fp8_memory.py [--layers 4]
"""
from __future__ import annotations

import argparse
import json

import torch
from transformers import DeepseekV3Config

from core_runner.loader.footprint import estimate_footprint
from core_runner.quantization import Fp8BlockQuantization

# DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json) but num_hidden_layers
V3 = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
          num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512, q_lora_rank=1536, qk_nope_head_dim=128,
          qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
          first_k_dense_replace=3, n_group=8, topk_group=4, norm_topk_prob=True, routed_scaling_factor=2.5,
          max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False)


def report(layers: int) -> dict:
    from core_runner_deepseek.model import DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(**{**V3, "num_hidden_layers": layers})
    bf16 = estimate_footprint(DeepseekV3ForCausalLM, cfg, torch.bfloat16)
    fp8 = estimate_footprint(DeepseekV3ForCausalLM, cfg, torch.bfloat16, Fp8BlockQuantization((128, 128)))
    if bf16 is None or fp8 is None:
        raise SystemExit("the model could not be built with fake tensors")
    return {"model": f"DeepSeek-V3 shape, {layers} layers ({min(layers, 3)} dense)", "bf16_bytes": bf16.bytes,
            "fp8_bytes": fp8.bytes, "ratio": round(fp8.bytes / bf16.bytes, 4),
            "bf16_gib": round(bf16.bytes / 2**30, 2), "fp8_gib": round(fp8.bytes / 2**30, 2)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    print(json.dumps(report(ap.parse_args().layers)))
