"""Models that fail on one tensor-parallel rank only (imported by name in the workers)."""
from __future__ import annotations

import torch
from core_runner_qwen3.model import Qwen3ForCausalLM

from core_runner.layers import get_tensor_model_parallel_rank


class FailsToBuildOnRank1(Qwen3ForCausalLM):
    def __init__(self, config) -> None:
        if get_tensor_model_parallel_rank() == 1:
            raise RuntimeError("rank 1 cannot build this model")
        super().__init__(config)


class FailsAtPosition12OnRank1(Qwen3ForCausalLM):
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if get_tensor_model_parallel_rank() == 1 and int(positions.max()) >= 12:
            raise RuntimeError("rank 1 fails at position 12")
        return super().forward(input_ids, positions)
