"""LayerNorm (mean and variance over the last dimension, affine weight and bias).

Statistics are computed in float32 whatever the input dtype; parameter names are
``weight`` and ``bias``, as in Hugging Face checkpoints.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension, statistics in
    float32; returns x's shape and dtype. ``bias=False`` drops the bias (no parameter)."""
    def __init__(self, hidden_size: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        if bias:
            self.bias = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """LayerNorm(x), or LayerNorm(x + residual) (the post-norm residual of encoders)."""
        if residual is not None:
            x = x + residual
        dtype = x.dtype
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), (self.hidden_size,), self.weight.float(), bias, self.eps).to(dtype)
