"""silu(gate) * up; the Triton kernel on the Triton path, this torch code otherwise."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core_runner.forward_context import use_triton_kernels


class SiluAndMul(nn.Module):
    """silu(gate) * up for a fused [gate | up] input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_triton_kernels(x):
            from core_runner.kernels.silu_mul_triton import silu_mul_triton

            return silu_mul_triton(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
