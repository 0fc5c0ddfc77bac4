"""GraniteMoeForCausalLM (Granite 3.x MoE): attention + a top-k MoE (no shared MLP) in every
layer, with Granite's multipliers; RoPE on every layer. The layers are ``common.py``'s,
the ones the hybrid's attention layers and experts use."""
from __future__ import annotations

from typing import Any

import torch

from core_runner_granite_hybrid.common import (
    MOE_NAMES,
    GraniteAttention,
    GraniteCausalLM,
    GraniteDecoderLayer,
    GraniteMoE,
    check_silu,
)


class GraniteMoeDecoderLayer(GraniteDecoderLayer):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        check_silu(getattr(config, "hidden_act", "silu"))
        self.self_attn = GraniteAttention(config, rope=True)
        self.block_sparse_moe = GraniteMoE(config)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.block_sparse_moe(h)


class GraniteMoeForCausalLM(GraniteCausalLM):
    weight_names = MOE_NAMES

    def __init__(self, config: Any) -> None:
        super().__init__(config, [GraniteMoeDecoderLayer(config) for _ in range(config.num_hidden_layers)])
