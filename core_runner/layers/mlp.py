"""The gated MLP most decoder families share: down(act(gate(x)) * up(x))."""
from __future__ import annotations

import torch
from torch import nn

from core_runner.distributed import divide, get_tensor_model_parallel_world_size
from core_runner.layers.activation import act_and_mul
from core_runner.layers.linear import MergedColumnParallelLinear, RowParallelLinear


class GatedMLP(nn.Module):
    """act(gate) * up of ``intermediate`` units (1/tp of them on each rank), then down.
    Parameters ``gate_up_proj`` (gate rows, then up rows) and ``down_proj``, as the
    checkpoints' ``gate_proj`` / ``up_proj`` / ``down_proj`` map onto them; ``hidden_act``
    is a transformers activation name that ``act_and_mul`` accepts."""

    def __init__(self, hidden: int, intermediate: int, hidden_act: str, bias: bool = False) -> None:
        super().__init__()
        divide(intermediate, get_tensor_model_parallel_world_size(), "intermediate_size")
        self.gate_up_proj = MergedColumnParallelLinear(hidden, [intermediate, intermediate], bias=bias)
        self.down_proj = RowParallelLinear(intermediate, hidden, bias=bias)
        self.act = act_and_mul(hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))
