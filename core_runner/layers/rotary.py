"""Rotary position embedding (rotate-half layout) from a precomputed cos/sin table.

On the Triton path (``use_triton_kernels``) one kernel ropes q and k together; this
torch code is the reference and the CPU path."""
from __future__ import annotations

import torch
from torch import nn

from core_runner.forward_context import use_triton_kernels


def rope_theta_of(config: object, default: float = 10000.0) -> float:
    """Read the RoPE base from an HF config: ``rope_parameters`` (transformers 5) or ``rope_theta``."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        kind = params.get("rope_type", "default")
        if kind not in ("default", None):
            raise ValueError(f"rope_type={kind!r} is not supported: only 'default' RoPE is implemented")
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", None) or default)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float) -> None:
        super().__init__()
        if rotary_dim % 2:
            raise ValueError(f"rotary_dim={rotary_dim} must be even")
        self.head_size, self.rotary_dim = head_size, rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim))
        t = torch.arange(max_position, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def rotate_ref(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The torch reference of the Triton kernel (``kernels/rotary_triton.py``)."""
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        x1, x2 = rot.float().chunk(2, dim=-1)
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([out, rest], dim=-1) if rest.numel() else out

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, heads, D], k: [T, kv_heads, D], positions: [T]."""
        if use_triton_kernels(q) and q.dim() == 3 and k.dim() == 3 and q.stride(-1) == 1 and k.stride(-1) == 1:
            from core_runner.kernels.rotary_triton import rotary_triton

            return rotary_triton(positions, q, k, self.cos_sin, self.rotary_dim)
        cos, sin = self.cos_sin[positions.long()].unsqueeze(1).chunk(2, dim=-1)
        return self.rotate_ref(q, cos, sin), self.rotate_ref(k, cos, sin)
