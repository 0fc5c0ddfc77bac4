"""RMSNorm with an optional fused residual add (the add happens in the input dtype), and
Gemma's variant that scales by (1 + weight).

On the Triton path (``use_triton_kernels``) one kernel does the add and the norm of a
2-D [T, H] or 3-D [T, heads, D] input, strided rows included; this torch code is the
reference and the CPU path. ``GemmaRMSNorm`` (fp32 math, one cast back) takes the same
kernel in its Gemma mode."""
from __future__ import annotations

import torch
from torch import nn

from core_runner.forward_context import use_triton_kernels


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension (statistics in float32).
    ``forward(x)`` returns the normed x; ``forward(x, residual)`` returns (norm(x + residual),
    x + residual), the sum being the next layer's residual. Shape and dtype of x."""
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def norm_ref(self, x: torch.Tensor) -> torch.Tensor:
        """The torch reference of the Triton kernel (``kernels/rms_norm_triton.py``)."""
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)

    @staticmethod
    def _triton_fits(x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        if x.dim() not in (2, 3) or x.stride(-1) != 1:
            return False
        return residual is None or (
            residual.shape == x.shape and residual.dtype == x.dtype and residual.stride(-1) == 1
        )

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if use_triton_kernels(x) and self._triton_fits(x, residual):
            from core_runner.kernels.rms_norm_triton import rms_norm_triton

            return rms_norm_triton(x, self.weight, self.eps, residual)
        if residual is None:
            return self.norm_ref(x)
        x = x + residual
        return self.norm_ref(x), x


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + weight), all in float32 and cast
    back to x's dtype once (transformers' Gemma/Gemma2/Gemma3 RMSNorm; the checkpoint's
    weight is stored zero-centred). ``forward(x)`` and ``forward(x, residual)`` as
    ``RMSNorm`` (the residual add in x's dtype); the Triton path is ``rms_norm_triton``
    with ``gemma=True``, this torch code its reference."""
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)

    def norm_ref(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if use_triton_kernels(x) and RMSNorm._triton_fits(x, residual):
            from core_runner.kernels.rms_norm_triton import rms_norm_triton

            return rms_norm_triton(x, self.weight, self.eps, residual, gemma=True)
        if residual is None:
            return self.norm_ref(x)
        x = x + residual
        return self.norm_ref(x), x
