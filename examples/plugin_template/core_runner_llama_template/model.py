"""LlamaForCausalLM assembled from core_runner.layers.

Parameter names follow the Hugging Face checkpoint; ``packed_modules_mapping`` tells
the loader which checkpoint tensors go into the fused q/k/v and gate/up matrices. The
attention layer gets its paged KV cache from the runner and its metadata from the
forward context, so nothing here knows about blocks, rows or batches.

Tensor parallelism comes from the layer classes: q/k/v and gate/up are column-parallel
(each rank computes its own heads / intermediate features), o_proj and down_proj are
row-parallel (they all-reduce back to the full hidden size), and the embedding and LM
head are split over the vocabulary. Everything between (norms, residuals, RoPE) runs
whole on every rank. With one rank the same classes hold whole weights.

The blocks are core_runner.layers' standard ones (``DecoderAttention``, ``GatedMLP``,
``PreNormDecoderLayer``, ``DecoderStack``), configured by options; a family whose layer
differs in more than options writes its own ``nn.Module`` with the same parameter names.

For EAGLE-3 speculative decoding the draft reads the residual stream entering a few of
these layers: ``set_aux_hidden_state_layers`` (vLLM's name) makes ``forward`` return
them beside the hidden states. The stream is whole on every rank, as said above.
"""
from __future__ import annotations

from typing import Any

from core_runner.layers import (
    AuxHiddenStates,
    CausalLM,
    DecoderAttention,
    DecoderStack,
    GatedMLP,
    PreNormDecoderLayer,
)


def check_supported(config: Any) -> None:
    """Refuse what this model does not implement, rather than run it wrong."""
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported by core-runner-llama-template: expected 'silu'")


def llama_layer(config: Any, layer_idx: int) -> PreNormDecoderLayer:
    """One Llama layer: GQA with RoPE (any rope type transformers knows, Llama 3.x: 'llama3';
    q/k/v/o biases when ``attention_bias``), then the SiLU-gated MLP (``mlp_bias``)."""
    mlp = GatedMLP(config.hidden_size, config.intermediate_size, "silu", bias=bool(getattr(config, "mlp_bias", False)))
    return PreNormDecoderLayer(DecoderAttention(config), mlp, config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(AuxHiddenStates, CausalLM):
    """``Model(hf_config)``; ``forward(input_ids, positions) -> hidden`` (or (hidden, aux), see
    ``set_aux_hidden_state_layers``); ``compute_logits``. The loader's hooks are CausalLM's:
    q/k/v and gate/up packed (``packed_modules_mapping``), rotary caches and a tied head's
    second copy skipped (``ignored_weight_patterns``)."""

    def __init__(self, config: Any) -> None:
        check_supported(config)
        super().__init__(config, DecoderStack(config, llama_layer))
