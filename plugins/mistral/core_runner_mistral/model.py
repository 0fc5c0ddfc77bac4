"""MistralForCausalLM from core_runner.layers: Llama's decoder (GQA, RoPE, pre-norm RMSNorm
blocks, gated MLP) with sliding-window attention on every layer.

``sliding_window`` in the config is the window of every layer (transformers' rule: a
query at position p sees keys p - window < k <= p); ``None`` (Mistral-7B-v0.3, Nemo) is
full causal attention. The window is an option of each ``Attention`` layer, so its cache
spec carries it and the backend masks by it; nothing else in the model knows about it.

Under tensor parallelism (vLLM's split) each rank holds num_attention_heads / tp query
heads and num_key_value_heads / tp KV heads (one KV head, replicated, when tp exceeds
their count); o_proj and down_proj are row-parallel (one all-reduce each), gate/up
column-parallel, and the embedding and LM head split the vocabulary.
"""
from __future__ import annotations

from typing import Any

from core_runner.layers import (
    CausalLM,
    DecoderAttention,
    DecoderStack,
    GatedMLP,
    PreNormDecoderLayer,
)


def mistral_layer(config: Any, layer_idx: int) -> PreNormDecoderLayer:
    """Llama's pre-norm layer; every layer's attention has the config's window."""
    attn = DecoderAttention(config, bias=False, sliding_window=getattr(config, "sliding_window", None))
    mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act)
    return PreNormDecoderLayer(attn, mlp, config.hidden_size, config.rms_norm_eps)


class MistralForCausalLM(CausalLM):
    """``Model(hf_config)``; ``forward(input_ids, positions) -> hidden``; ``compute_logits``."""

    def __init__(self, config: Any) -> None:
        super().__init__(config, DecoderStack(config, mistral_layer))
