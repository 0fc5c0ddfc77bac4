"""A granite-4.0-h-350m-shaped checkpoint with random weights, for ``core-runner bench``
(W1 next to the transformers peer). Run on the GPU only.

The shape follows ibm-granite/granite-4.0-h-350m's published config as recalled here
(32 layers: 28 Mamba2 + 4 attention, NoPE, dense shared MLP, no experts); check it
against the hub's config.json before quoting results as "granite-4.0-h-350m".

    python -m core_runner_granite_hybrid.bench /path/out          # builds the checkpoint
    core-runner bench --model /path/out --workload W1 --peer W1
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

ATTENTION_LAYERS = (10, 13, 17, 27)
GRANITE_4_0_H_350M = dict(
    vocab_size=100352, hidden_size=768, num_hidden_layers=32,
    layer_types=["attention" if i in ATTENTION_LAYERS else "mamba" for i in range(32)],
    num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-5,
    position_embedding_type="nope", attention_bias=False,
    mamba_n_heads=48, mamba_d_head=32, mamba_d_state=128, mamba_n_groups=1, mamba_d_conv=4, mamba_expand=2,
    mamba_chunk_size=256, mamba_conv_bias=True, mamba_proj_bias=False,
    shared_intermediate_size=2048, intermediate_size=2048, num_local_experts=0, num_experts_per_tok=0,
    embedding_multiplier=12.0, attention_multiplier=0.0078125, residual_multiplier=0.246, logits_scaling=3.0,
    tie_word_embeddings=True, initializer_range=0.02, hidden_act="silu",
    bos_token_id=None, eos_token_id=None, pad_token_id=None,
)


def granite_4_0_h_350m_config(**overrides: Any):
    from transformers import GraniteMoeHybridConfig

    config = GraniteMoeHybridConfig(**{**GRANITE_4_0_H_350M, **overrides})
    config.architectures = ["GraniteMoeHybridForCausalLM"]
    return config


def make_random_checkpoint(path: str | Path, config=None, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                           device: str | None = None) -> Path:
    """Build the HF model on the meta device, materialise it in ``dtype`` and fill it:
    matrices ~ N(0, initializer_range), norms 1, and Mamba's A_log / D / dt_bias as the
    HF initialiser sets them; then ``save_pretrained``."""
    from transformers import GraniteMoeHybridForCausalLM

    config = config or granite_4_0_h_350m_config()
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = GraniteMoeHybridForCausalLM(config)
    finally:
        torch.set_default_dtype(prev)
    model = model.to_empty(device=device)
    model.tie_weights()  # to_empty gives tied parameters separate storage
    gen = torch.Generator(device=device).manual_seed(seed)
    std = float(config.initializer_range)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "A_log":
                p.copy_(torch.log(torch.arange(1, p.numel() + 1, dtype=torch.float32)).to(p.dtype))
            elif leaf in ("D", "dt_bias") or "norm" in name:
                p.fill_(1.0)
            elif leaf == "bias":
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)
    model.save_pretrained(str(path))
    return path


if __name__ == "__main__":  # pragma: no cover
    print(make_random_checkpoint(sys.argv[1]))
