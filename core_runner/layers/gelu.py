"""GELU activations and a lookup from Hugging Face ``hidden_act`` names."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Hugging Face hidden_act name -> torch's ``approximate`` argument
_GELU_NAMES = {
    "gelu": "none",  # exact, erf-based
    "gelu_new": "tanh",
    "gelu_pytorch_tanh": "tanh",
    "gelu_fast": "tanh",
}


class GELU(nn.Module):
    """GELU(x) = x * Phi(x) elementwise: exact (erf) with ``approximate="none"``, or the
    tanh approximation with ``"tanh"``; returns a tensor of x's shape and dtype."""
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU approximate={approximate!r} is invalid: expected 'none' or 'tanh'")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate=self.approximate)


def gelu_from_name(name: str) -> GELU:
    """The GELU for a config's ``hidden_act`` (``gelu``, ``gelu_new``, ``gelu_pytorch_tanh``, ...)."""
    if name not in _GELU_NAMES:
        raise ValueError(f"hidden_act={name!r} is not supported: expected one of {sorted(_GELU_NAMES)}")
    return GELU(_GELU_NAMES[name])
