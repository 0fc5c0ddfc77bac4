"""GraniteForCausalLM (Granite 3.x dense): Llama-shaped attention + SiLU-gated MLP layers
with Granite's multipliers (``common.py``); RoPE on every layer; optional biases on the
attention (``attention_bias``) and MLP (``mlp_bias``) projections.

Under tensor parallelism the MLP keeps 1/tp of its intermediate units on each rank
(gate/up column-parallel, down row-parallel: one all-reduce)."""
from __future__ import annotations

from typing import Any

import torch

from core_runner.layers import GatedMLP
from core_runner_granite_hybrid.common import GraniteAttention, GraniteCausalLM, GraniteDecoderLayer, check_silu


class GraniteMLP(GatedMLP):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), gate and up in one matrix."""

    def __init__(self, config: Any) -> None:
        check_silu(getattr(config, "hidden_act", "silu"))
        super().__init__(config.hidden_size, config.intermediate_size, "silu",
                         bias=bool(getattr(config, "mlp_bias", False)))


class GraniteDenseDecoderLayer(GraniteDecoderLayer):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.self_attn = GraniteAttention(config, rope=True)
        self.mlp = GraniteMLP(config)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(h)


class GraniteForCausalLM(GraniteCausalLM):
    packed_modules_mapping = {
        **GraniteCausalLM.packed_modules_mapping, "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, config: Any) -> None:
        super().__init__(config, [GraniteDenseDecoderLayer(config) for _ in range(config.num_hidden_layers)])
