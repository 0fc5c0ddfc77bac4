"""Gemma2ForCausalLM and Gemma3ForCausalLM (text) from core_runner.layers.

Both are GQA decoders with what sets Gemma apart from Llama:
- RMSNorm scaling by (1 + weight) in float32 (``GemmaRMSNorm``), four per layer: input,
  post-attention, pre- and post-feed-forward; the residual adds the *normed* block outputs;
- the embedding scaled by sqrt(hidden_size), rounded to the embedding's dtype first, as
  transformers does (bf16 turns sqrt(3072) into 55.5); the LM head tied to the unscaled
  embedding unless the config unties it;
- act(gate) * up with ``hidden_activation`` (gelu_pytorch_tanh);
- queries scaled by query_pre_attn_scalar ** -0.5 (not head_dim ** -0.5);
- per-layer attention kind from ``config.layer_types``: "sliding_attention" layers see the
  last ``sliding_window`` positions (transformers' rule p - window < k <= p), the
  "full_attention" ones everything;
- ``final_logit_softcapping``: logits -> cap * tanh(logits / cap) (``compute_logits``).

Gemma2 adds ``attn_logit_softcapping`` (scores -> cap * tanh(scores / cap), the Attention
layer's ``logits_soft_cap``). Gemma3 adds per-head q/k norms before RoPE and a RoPE per
layer kind (``rope_parameters[layer_type]`` in transformers 5: rope_local_base_freq for the
sliding layers, rope_theta and any scaling for the full ones).

Under tensor parallelism (vLLM's split) each rank holds num_attention_heads / tp query
heads and num_key_value_heads / tp KV heads (one KV head, replicated, when tp exceeds
their count); o_proj and down_proj are row-parallel (one all-reduce each), gate/up
column-parallel, the embedding and LM head split the vocabulary. Norms (q/k norms act per
head) and the soft caps are whole on every rank; the final cap applies to gathered logits.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import (
    CausalLM,
    DecoderAttention,
    GatedMLP,
    GemmaRMSNorm,
    VocabParallelEmbedding,
)

LAYER_TYPES = ("sliding_attention", "full_attention")


def layer_types_of(config: Any) -> list[str]:
    """``config.layer_types`` (transformers 5 always sets it for Gemma 2/3: from the
    alternation, or from sliding_window_pattern), checked: one known kind per layer."""
    kinds = getattr(config, "layer_types", None)
    n = config.num_hidden_layers
    if not isinstance(kinds, (list, tuple)) or len(kinds) != n or any(k not in LAYER_TYPES for k in kinds):
        raise ValueError(f"layer_types={kinds!r}: expected one of {list(LAYER_TYPES)} for each of the "
                         f"num_hidden_layers={n} layers")
    return list(kinds)


def gemma_attention(config: Any, layer_type: str, *, qk_norm: bool, logits_soft_cap: float | None,
                    rope_layer_type: str | None) -> DecoderAttention:
    """GQA with the layer's window (sliding layers only), Gemma's query scale, Gemma2's
    score soft cap and Gemma3's q/k norms; the RoPE of the layer's kind under Gemma3."""
    window = config.sliding_window if layer_type == "sliding_attention" else None
    return DecoderAttention(config, bias=bool(config.attention_bias), qk_norm=GemmaRMSNorm if qk_norm else None,
                            scale=config.query_pre_attn_scalar**-0.5, sliding_window=window,
                            logits_soft_cap=logits_soft_cap, rope_layer_type=rope_layer_type)


class GemmaDecoderLayer(nn.Module):
    """x + post_attn(attn(in(x))), then + post_ff(mlp(pre_ff(.))); the adds fused into the
    next norm (``GemmaRMSNorm(x, residual)`` returns norm(x + residual) and the sum)."""

    def __init__(self, config: Any, attn: nn.Module) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = attn
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_activation)
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            x, residual = self.input_layernorm(x), x
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.post_attention_layernorm(self.self_attn(positions, x))
        x, residual = self.pre_feedforward_layernorm(x, residual)
        return self.post_feedforward_layernorm(self.mlp(x)), residual


class GemmaModel(nn.Module):
    def __init__(self, config: Any, gemma3: bool) -> None:
        super().__init__()
        kinds = layer_types_of(config)
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # transformers keeps sqrt(hidden) as a float32 tensor and casts it to the embedding's dtype
        self.register_buffer("normalizer", torch.tensor(config.hidden_size**0.5, dtype=torch.float32),
                             persistent=False)
        soft_cap = None if gemma3 else config.attn_logit_softcapping
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(config, gemma_attention(config, kind, qk_norm=gemma3, logits_soft_cap=soft_cap,
                                                     rope_layer_type=kind if gemma3 else None))
            for kind in kinds)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        x, residual = x * self.normalizer.to(x.dtype), None
        for layer in self.layers:
            x, residual = layer(positions, x, residual)
        return self.norm(x, residual)[0]


class _GemmaForCausalLM(CausalLM):
    """``Model(hf_config)``; ``forward(input_ids, positions) -> hidden``; ``compute_logits``
    (with the final soft cap). The LM head is tied unless the config unties it."""

    gemma3 = False

    def __init__(self, config: Any) -> None:
        super().__init__(config, GemmaModel(config, self.gemma3), tie_default=True)
        self.final_logit_softcapping = config.final_logit_softcapping

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        cap = self.final_logit_softcapping
        if cap is not None:  # transformers' order of operations: / cap, tanh, * cap
            logits = torch.tanh(logits / cap) * cap
        return logits


class Gemma2ForCausalLM(_GemmaForCausalLM):
    """Gemma 2: sliding / full layers, attention and final logit soft caps."""

    gemma3 = False


class Gemma3ForCausalLM(_GemmaForCausalLM):
    """Gemma 3 (text): q/k norms, a RoPE per layer kind, sliding / full layers by pattern."""

    gemma3 = True
