"""Gated activations act(gate) * up over a fused [gate | up] input: SiLU (the Triton
kernel on the Triton path, this torch code otherwise) and GELU (torch code on every path),
and the one for a Hugging Face ``hidden_act`` name."""
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


class GeluAndMul(nn.Module):
    """gelu(gate) * up for a fused [gate | up] input [..., 2 * d] -> [..., d]: exact (erf)
    GELU with ``approximate="none"``, torch's tanh approximation with ``"tanh"`` (Gemma's
    ``gelu_pytorch_tanh``). Elementwise, so under tensor parallelism each rank gates its own
    slice of the intermediate features."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GeluAndMul approximate={approximate!r} is invalid: expected 'none' or 'tanh'")
        self.approximate = approximate

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up


# Hugging Face hidden_act name -> the gated layer computing exactly what transformers'
# ACT2FN[name](gate) * up computes (names whose transformers formula differs from torch's,
# such as gelu_new or gelu_fast, are left out rather than approximated)
GATED_ACTIVATIONS = ("silu", "swish", "gelu", "gelu_pytorch_tanh")


def act_and_mul(name: str) -> nn.Module:
    """The gated activation layer for a config's ``hidden_act`` / ``hidden_activation``
    (one of ``GATED_ACTIVATIONS``); a ValueError naming the value otherwise."""
    if name in ("silu", "swish"):
        return SiluAndMul()
    if name == "gelu":
        return GeluAndMul("none")
    if name == "gelu_pytorch_tanh":
        return GeluAndMul("tanh")
    raise ValueError(f"activation {name!r} is not supported by a gated MLP: expected one of {list(GATED_ACTIVATIONS)}")
