"""The attention layer: writes this step's K/V into its paged cache, then attends.

The cache tensor is bound by the runner (``self.kv_cache``) from the layer's
``kv_cache_spec``; metadata and backend come from the forward context.
"""
from __future__ import annotations

import torch
from torch import nn

from core_runner.forward_context import get_forward_context
from core_runner.kv_cache_spec import PagedCacheSpec


class Attention(nn.Module):
    """Multi-head / grouped-query attention over a paged KV cache.

    ``forward(q, k, v)`` writes this step's k, v ([T, num_kv_heads * head_size]) into the
    cache at the slots of the step's metadata, then returns, for every query token, the
    softmax(scale * q k^T) v over its request's cached tokens (causal), as
    [T, num_heads * head_size]. ``kv_cache_spec`` declares the cache (K and V parts,
    num_kv_heads x head_size per token); ``num_heads`` must be a multiple of ``num_kv_heads``.
    """
    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, scale: float) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_size, self.scale = num_heads, num_kv_heads, head_size, scale
        self.kv_cache: torch.Tensor | None = None
        self.layer_name = ""

    def kv_cache_spec(self, layer_name: str, dtype: torch.dtype) -> PagedCacheSpec:
        self.layer_name = layer_name
        return PagedCacheSpec(layer_name, self.num_kv_heads, self.head_size, dtype, num_parts=2)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, heads*D] or [T, heads, D]; returns [T, heads*D]."""
        ctx = get_forward_context()
        if self.kv_cache is None:
            raise RuntimeError(f"attention layer {self.layer_name or '?'} has no KV cache bound")
        q = q.view(-1, self.num_heads, self.head_size)
        k = k.view(-1, self.num_kv_heads, self.head_size)
        v = v.view(-1, self.num_kv_heads, self.head_size)
        ctx.backend.write_kv(self.kv_cache, k, v, ctx.attn_metadata)
        out = ctx.backend.forward(q, self.kv_cache, ctx.attn_metadata, self.scale)
        return out.reshape(q.shape[0], self.num_heads * self.head_size)
