"""A DeepSeek-V2-Lite-shaped random checkpoint for ``core-runner bench --model <path>``.

    python -m core_runner_deepseek.bench /tmp/v2lite          # bf16, on CUDA when present
    core-runner bench --model /tmp/v2lite --peer W1 W2        # (see benchmarks/gpu_check.sh)

The config is DeepSeek-V2-Lite's published one (``examples.DEEPSEEK_V2_LITE_PUBLISHED``):
15.7B parameters, 2.4B active: 27 layers, hidden 2048, 16 heads, kv_lora_rank 512, rope 64,
no q_lora, 64 routed experts of 1408 + 2 shared, top-6 greedy routing, first layer dense,
YaRN RoPE (factor 40 over 4,096 original positions, mscale 0.707) and 163,840 positions.
Only the weights are random. The engine's max_model_len does not follow the 163,840: it
defaults to min(2048, positions), which W1-W3 fit (``--max-model-len`` sets another); the
one cos/sin table, shared by the layers, is 163,840 x 64 fp32 (42 MB).
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

from core_runner_deepseek.examples import DEEPSEEK_V2_LITE_PUBLISHED


def v2_lite_config(**overrides):
    """DeepSeek-V2-Lite's published config as a transformers ``DeepseekV2Config``, with
    ``overrides`` (e.g. smaller sizes for a test) replacing fields. No BOS / EOS / pad id:
    random weights have no end token, and a peer's ``generate`` must not stop on one."""
    from transformers import DeepseekV2Config

    # a deep copy: the config class writes rope_type / rope_theta into the rope dict it gets
    cfg = copy.deepcopy(DEEPSEEK_V2_LITE_PUBLISHED)
    cfg.update(initializer_range=0.02, bos_token_id=None, eos_token_id=None, pad_token_id=None)
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
