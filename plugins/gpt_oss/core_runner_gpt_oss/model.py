"""GptOssForCausalLM (openai/gpt-oss) from core_runner.layers.

Each layer: pre-norm GQA attention with biased q/k/v/o projections, RoPE (YaRN in the
published checkpoints; any rope type through ``get_rope``) and a learned per-head sink
logit in the softmax denominator; ``config.layer_types`` makes a layer
``sliding_attention`` (keys p - sliding_window < k <= p) or ``full_attention``. Then a
sparse MoE on every layer: a biased router, softmax over the top-k logits, experts with
gate/up and down biases and the clamped SwiGLU ((up + 1) * gate * sigmoid(alpha * gate),
gate <= limit, |up| <= limit): ``FusedMoE(has_bias=True, activation="swigluoai")``.

Checkpoint names are transformers' (``mlp.router``, ``mlp.experts.gate_up_proj`` [E, H, 2I]
with interleaved gate/up columns, ``down_proj`` [E, I, H], their ``_bias``, ``self_attn.sinks``);
``map_weight_name`` renames the stacked expert tensors to FusedMoE's parameters, which
de-interleave them at load (``checkpoint_layout="transposed_interleaved"``).

Tensor parallelism (vLLM's split): each rank holds num_attention_heads / tp query heads
with their sinks, num_key_value_heads / tp KV heads (one, replicated, when tp exceeds
them); o_proj row-parallel (its bias added once after the all-reduce); the router whole
on every rank, so every rank picks the same experts; experts split by intermediate units
(gate/up biases with their rows, the down bias added by rank 0) or, with expert
parallelism, whole experts per rank; vocabulary split for the embedding and LM head.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    CausalLM,
    DecoderAttention,
    DecoderStack,
    FusedMoE,
    Linear,
    PreNormDecoderLayer,
    softmax_topk,
    stacked_expert_name,
)

LAYER_TYPES = ("sliding_attention", "full_attention")


def layer_types_of(config: Any) -> list[str]:
    """One of LAYER_TYPES per layer (transformers' default alternates, sliding first);
    ValueError naming ``layer_types`` for a list that is short or has another kind."""
    n = config.num_hidden_layers
    kinds = getattr(config, "layer_types", None)
    if kinds is None:
        kinds = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    kinds = list(kinds)
    bad = sorted({str(k) for k in kinds[:n] if k not in LAYER_TYPES})
    if len(kinds) < n or bad:
        raise ValueError(f"layer_types={kinds!r} is not supported: expected num_hidden_layers={n} entries, each one "
                         f"of {LAYER_TYPES}{f' (got {bad})' if bad else ''}")
    return kinds




class GptOssMLP(nn.Module):
    """Biased router -> top-k logits -> softmax over them (= softmax over all experts,
    renormalised over the kept ones) -> biased experts with the clamped SwiGLU."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        num_experts, self.top_k = config.num_local_experts, config.num_experts_per_tok
        if not 0 < self.top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={self.top_k} must be in 1..num_local_experts={num_experts}")
        self.router = Linear(config.hidden_size, num_experts, bias=True)
        # transformers 5.25 reads both from the config; 5.17 fixes them at these values (a dormant field there)
        self.experts = FusedMoE(
            num_experts, config.hidden_size, config.intermediate_size, has_bias=True, activation="swigluoai",
            swiglu_alpha=float(getattr(config, "swiglu_alpha", 1.702)),
            swiglu_limit=float(getattr(config, "swiglu_limit", 7.0)),
            checkpoint_layout="transposed_interleaved",
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(self.router(x), self.top_k, renormalize=True)
        return self.experts(x, weights, ids)


def gpt_oss_layer(config: Any, layer_idx: int) -> PreNormDecoderLayer:
    """Pre-norm layer: attention with q/k/v/o biases, sinks and the layer's window, then the MoE."""
    layer_type = layer_types_of(config)[layer_idx]
    window = getattr(config, "sliding_window", None) if layer_type == "sliding_attention" else None
    if layer_type == "sliding_attention" and window is None:
        raise ValueError("sliding_window=None: layer_types has sliding_attention layers, which need a window")
    attn = DecoderAttention(config, bias=bool(getattr(config, "attention_bias", True)), sliding_window=window,
                            sinks=True)
    return PreNormDecoderLayer(attn, GptOssMLP(config), config.hidden_size, config.rms_norm_eps)


class GptOssForCausalLM(CausalLM):
    packed_modules_mapping = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}

    def __init__(self, config: Any) -> None:
        super().__init__(config, DecoderStack(config, gpt_oss_layer))

    @staticmethod
    def map_weight_name(name: str) -> str:
        """transformers' stacked expert tensors -> FusedMoE's parameters (``w13.weight`` ...)."""
        return stacked_expert_name(name)
