"""Qwen3ForCausalLM from core_runner.layers: GQA with per-head q/k RMSNorm before RoPE.

Under tensor parallelism (vLLM's split) each rank holds num_attention_heads / tp query
heads and num_key_value_heads / tp KV heads (one KV head, replicated, when tp exceeds
their count), so its attention layers and KV cache are the rank's; o_proj and
down_proj are row-parallel (one all-reduce each), gate/up column-parallel, and the
embedding and LM head split the vocabulary. q_norm / k_norm act per head, so they are
whole on every rank.

EAGLE-3 drafts read the residual stream at the inputs of a few target layers
(``set_aux_hidden_state_layers``); the stream is whole on every rank, so under tensor
parallelism each rank hands its draft the same states.
"""
from __future__ import annotations

from typing import Any, Callable

from torch import nn

from core_runner.layers import (
    AuxHiddenStates,
    CausalLM,
    DecoderAttention,
    DecoderStack,
    GatedMLP,
    PreNormDecoderLayer,
    RMSNorm,
)


class Qwen3MLP(GatedMLP):
    """SiLU-gated MLP of ``intermediate`` units (the config's intermediate_size), 1/tp of
    them on each rank."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__(hidden, intermediate, "silu")


class Qwen3DecoderLayer(PreNormDecoderLayer):
    """Pre-norm attention + MLP block, by default Qwen3's attention (per-head q/k RMSNorm
    before RoPE) and SiLU MLP; ``mlp`` lets a variant (MoE) swap the MLP, ``attn`` the
    attention (the EAGLE drafts' Llama attention), and ``input_layernorm=False`` drops the
    first norm (EAGLE's first layer: its input enters attention as it is)."""

    def __init__(self, config: Any, mlp: nn.Module | None = None, attn: nn.Module | None = None,
                 input_layernorm: bool = True, sliding_window: int | None = None) -> None:
        if attn is None:
            attn = DecoderAttention(config, qk_norm=RMSNorm, sliding_window=sliding_window)
        if mlp is None:
            mlp = Qwen3MLP(config.hidden_size, config.intermediate_size)
        super().__init__(attn, mlp, config.hidden_size, config.rms_norm_eps, input_layernorm=input_layernorm)


def layer_window(config: Any, layer_idx: int) -> int | None:
    """The sliding window of layer ``layer_idx`` as transformers applies it: from
    ``layer_types`` where the config has them (Qwen3: layers from max_window_layers on when
    use_sliding_window), else ``sliding_window`` on every layer (Qwen3-MoE); the configs
    set sliding_window to None unless use_sliding_window."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if window is None or types is None:
        return window
    return window if types[layer_idx] == "sliding_attention" else None


def qwen3_layer(config: Any, layer_idx: int) -> Qwen3DecoderLayer:
    return Qwen3DecoderLayer(config, sliding_window=layer_window(config, layer_idx))


class Qwen3Model(DecoderStack):
    """``forward`` returns the final hidden states or, once ``aux_layers`` is set, also
    the residual stream entering each of those layers (EAGLE-3's inputs)."""

    def __init__(self, config: Any, make_layer: Callable[[Any, int], nn.Module] | None = None) -> None:
        super().__init__(config, make_layer or qwen3_layer)


class Qwen3ForCausalLM(AuxHiddenStates, CausalLM):
    def __init__(self, config: Any) -> None:
        super().__init__(config, Qwen3Model(config))
