"""Qwen3MoeForCausalLM: Qwen3 attention with sparse MoE MLPs (shared FusedMoE layer).

A layer is sparse when it is not in ``mlp_only_layers`` and (layer + 1) is a multiple
of ``decoder_sparse_step``; other layers keep a dense MLP of ``intermediate_size``.
Routing is softmax top-k, renormalised over the kept experts when ``norm_topk_prob``.

Under tensor parallelism the router ``gate`` is whole on every rank, so every rank picks
the same experts for a token; the experts split as ``FusedMoE`` describes (1/tp of each
expert's intermediate units, or whole experts per rank with expert parallelism) and
all-reduce their partial sums.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from core_runner.layers import QKV_GATE_UP_PACKED, AuxHiddenStates, CausalLM, Linear
from core_runner.layers.fused_moe import FusedMoE, expert_packed_mapping
from core_runner.layers.moe_routing import softmax_topk
from core_runner_qwen3.model import Qwen3DecoderLayer, Qwen3Model, layer_window


class Qwen3MoeSparseBlock(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = bool(getattr(config, "norm_topk_prob", False))
        self.gate = Linear(config.hidden_size, config.num_experts)
        self.experts = FusedMoE(config.num_experts, config.hidden_size, config.moe_intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = softmax_topk(self.gate(x), self.top_k, self.norm_topk_prob)
        return self.experts(x, weights, ids)


def is_sparse_layer(config: Any, layer_idx: int) -> bool:
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return (layer_idx not in (getattr(config, "mlp_only_layers", None) or [])
            and config.num_experts > 0 and (layer_idx + 1) % step == 0)


def moe_decoder_layer(config: Any, layer_idx: int) -> Qwen3DecoderLayer:
    """A Qwen3 decoder layer whose MLP is sparse where the config says so."""
    return Qwen3DecoderLayer(config, Qwen3MoeSparseBlock(config) if is_sparse_layer(config, layer_idx) else None,
                             sliding_window=layer_window(config, layer_idx))


class Qwen3MoeForCausalLM(AuxHiddenStates, CausalLM):
    def __init__(self, config: Any) -> None:
        if getattr(config, "use_sliding_window", False):
            raise ValueError("use_sliding_window=True is not supported by core-runner-qwen3")
        if (getattr(config, "hidden_act", "silu") or "silu") != "silu":
            raise ValueError(f"hidden_act={config.hidden_act!r} is not supported: only 'silu'")
        super().__init__(config, Qwen3Model(config, moe_decoder_layer))
        # per-expert tensors first (first match wins), then the attention and dense MLPs
        self.packed_modules_mapping = {**expert_packed_mapping(config.num_experts), **QKV_GATE_UP_PACKED}
