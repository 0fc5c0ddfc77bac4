"""Rotary position embedding from a precomputed cos/sin table, in either layout:

- rotate-half (``is_neox_style=True``, Llama/Qwen): feature i pairs with i + rotary_dim/2;
- interleaved (``is_neox_style=False``, GPT-J/DeepSeek): feature 2i pairs with 2i + 1.

``get_rope(config, head_size)`` builds the layer for any rope type transformers knows
(``rope_config.py``: default, linear, dynamic, yarn, longrope, llama3) with partial rotary;
layers asking for the same table share one tensor. On the Triton path
(``use_triton_kernels``) one kernel ropes q and k together; the torch code here is the
reference and the CPU path."""
from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn

from core_runner.forward_context import use_triton_kernels
from core_runner.layers.rope_config import cos_sin_of, default_inv_freq, rope_cos_sin_table, rope_parameters_of

# one table per (settings, width, length, device), alive while some layer holds it
_TABLES: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()


def rope_theta_of(config: object, default: float = 10000.0) -> float:
    """The RoPE base of an HF config (``rope_parameters`` or ``rope_theta``), any rope type."""
    params = rope_parameters_of(config)
    return float(params.get("rope_theta") or default)


class RotaryEmbedding(nn.Module):
    """Ropes the first ``rotary_dim`` features of each head; the rest pass through.

    ``RotaryEmbedding(head_size, rotary_dim, max_position, base)`` is plain (default) RoPE;
    ``cos_sin=`` supplies a ready ``[max_position, rotary_dim]`` table instead (``get_rope``)."""

    def __init__(self, head_size: int, rotary_dim: int, max_position: int, base: float = 10000.0,
                 is_neox_style: bool = True, cos_sin: torch.Tensor | None = None) -> None:
        super().__init__()
        if rotary_dim <= 0 or rotary_dim % 2 or rotary_dim > head_size:
            raise ValueError(f"rotary_dim={rotary_dim} must be even and in (0, head_size={head_size}]")
        self.head_size, self.rotary_dim, self.is_neox_style = head_size, rotary_dim, bool(is_neox_style)
        if cos_sin is None:
            cos_sin = cos_sin_of(default_inv_freq(base, rotary_dim), max_position).to(torch.empty(0).device)
        elif cos_sin.dim() != 2 or cos_sin.shape != (max_position, rotary_dim) or cos_sin.dtype != torch.float32:
            raise ValueError(f"cos_sin {tuple(cos_sin.shape)} {cos_sin.dtype} must be float32 "
                             f"[max_position={max_position}, rotary_dim={rotary_dim}]")
        self.max_position = max_position
        self.register_buffer("cos_sin", cos_sin, persistent=False)

    def extra_repr(self) -> str:
        return (f"head_size={self.head_size}, rotary_dim={self.rotary_dim}, max_position={self.max_position}, "
                f"is_neox_style={self.is_neox_style}")

    def rotate_ref(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """The torch reference of the Triton kernel (``kernels/rotary_triton.py``): fp32
        math, one cast back. cos/sin [..., rotary_dim / 2] broadcast over x's heads."""
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        rot = rot.float()
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
        else:
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        out = out.to(x.dtype)
        return torch.cat([out, rest], dim=-1) if rest.numel() else out

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, heads, D], k: [T, kv_heads, D] or [T, D] (one shared key, as MLA's k_pe);
        positions: [T]. Returns new tensors of the same shapes."""
        if q.dim() != 3 or k.dim() not in (2, 3) or q.shape[-1] != self.head_size or k.shape[-1] != self.head_size:
            raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must be [T, heads, {self.head_size}] "
                             f"and [T, kv_heads, {self.head_size}] or [T, {self.head_size}]")
        k3 = k.unsqueeze(1) if k.dim() == 2 else k
        if use_triton_kernels(q) and q.stride(-1) == 1 and k3.stride(-1) == 1:
            from core_runner.kernels.rotary_triton import rotary_triton

            q_out, k_out = rotary_triton(positions, q, k3, self.cos_sin, self.rotary_dim,
                                         is_neox_style=self.is_neox_style)
        else:
            cos, sin = self.cos_sin[positions.long()].unsqueeze(1).chunk(2, dim=-1)
            q_out, k_out = self.rotate_ref(q, cos, sin), self.rotate_ref(k3, cos, sin)
        return q_out, (k_out.squeeze(1) if k.dim() == 2 else k_out)


def get_rope(config: Any, head_size: int, rotary_dim: int | None = None, max_position: int | None = None,
             is_neox_style: bool = True, layer_type: str | None = None) -> RotaryEmbedding:
    """The rotary layer for an HF config's RoPE, whatever its rope type.

    ``rotary_dim`` defaults to ``int(head_size * partial_rotary_factor)``; ``max_position``
    (table rows) to ``config.max_position_embeddings``; ``is_neox_style=False`` rotates
    interleaved pairs; ``layer_type`` picks one entry of a per-layer-type
    ``rope_parameters``. The table is built on CPU and moved to the current default
    device (models are built under ``torch.device(...)``); equal requests share it."""
    params = rope_parameters_of(config, layer_type)
    if rotary_dim is None:
        rotary_dim = int(head_size * float(params["partial_rotary_factor"]))
    if max_position is None:
        max_position = int(getattr(config, "max_position_embeddings", 0) or 0)
    device = torch.empty(0).device
    max_pos_emb = getattr(config, "max_position_embeddings", None)
    key = repr((sorted(params.items()), max_pos_emb, rotary_dim, max_position, str(device)))
    table = _TABLES.get(key)
    if table is None:
        table = rope_cos_sin_table(config, rotary_dim, max_position or None, layer_type).to(device)
        _TABLES[key] = table
    return RotaryEmbedding(head_size, rotary_dim, table.shape[0], is_neox_style=is_neox_style, cos_sin=table)
