"""The attention layer: writes this step's K/V into its paged cache, then attends.

The cache tensor is bound by the runner (``self.kv_cache``) from the layer's
``kv_cache_spec``; metadata and backend come from the forward context. The layer's
options (window, soft cap, sinks) travel to the backend as one ``AttentionOptions``;
the engine refuses, at construction, a backend that does not list an option a layer uses
(``AttentionBackend.attention_features``).

``kv_scale`` (float32 [2]: k then v, a device buffer) holds the layer's fp8 KV cache
scales: 1.0 unless the checkpoint carries them (``core_runner/loader/kv_scales.py``). They
reach the backend only when the bound cache is fp8 (docs/fp8_kv_cache.md), so a backend
that never sees an fp8 cache need not take them.
"""
from __future__ import annotations

import torch
from torch import nn

from core_runner.attention.options import AttentionOptions
from core_runner.forward_context import get_forward_context
from core_runner.kv_cache_dtype import is_fp8
from core_runner.kv_cache_spec import PagedCacheSpec


class Attention(nn.Module):
    """Multi-head / grouped-query attention over a paged KV cache.

    ``forward(q, k, v)`` writes this step's k, v ([T, num_kv_heads * head_size]) into the
    cache at the slots of the step's metadata, then returns, for every query token, the
    softmax(scale * q k^T) v over its request's cached tokens (causal), as
    [T, num_heads * head_size]. ``num_heads`` must be a multiple of ``num_kv_heads``.

    Options (vLLM's names):

    - ``sliding_window``: a query at position p sees keys at p - window < k <= p only
      (transformers' rule); the layer's cache spec carries the window, so the block
      manager frees blocks every window has left.
    - ``logits_soft_cap``: scores become ``cap * tanh(scores / cap)`` after scaling.
    - ``sinks``: a tensor [num_heads] (this rank's heads) of learned logits that join
      each row's softmax denominator with a zero value; owned (and loaded) by the caller,
      read at every forward, so it is not registered as this module's parameter.
    - ``bidirectional_window``: for non-causal (encoder) layers, a query at p sees keys
      with |k - p| <= window. The cache spec carries no window: the layer shares the
      full-attention KV group and frees nothing early (encoder prompts run whole in one
      step, so there is nothing to free before the request ends).
    """
    def __init__(self, num_heads: int, num_kv_heads: int, head_size: int, scale: float, *,
                 sliding_window: int | None = None, logits_soft_cap: float | None = None,
                 sinks: torch.Tensor | None = None, bidirectional_window: int | None = None) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"sinks has shape {tuple(sinks.shape)}; it needs one logit per head: ({num_heads},)")
        self.num_heads, self.num_kv_heads, self.head_size, self.scale = num_heads, num_kv_heads, head_size, scale
        self.options = AttentionOptions(sliding_window, logits_soft_cap, sinks is not None, bidirectional_window)
        self.__dict__["sinks"] = sinks  # not a submodule parameter: the caller owns and loads it
        # float32 whatever the model dtype: a scale is a multiplier, not an activation
        self.register_buffer("kv_scale", torch.ones(2, dtype=torch.float32), persistent=False)
        self.kv_scale_loaded: tuple[str, ...] = ()  # checkpoint tensors that set kv_scale (the loader)
        self.kv_cache: torch.Tensor | None = None
        self.kv_cache_group = 0  # set by the runner (core_runner/kv_cache_groups.py)
        self.layer_name = ""

    @property
    def sliding_window(self) -> int | None:
        return self.options.sliding_window

    def kv_cache_spec(self, layer_name: str, dtype: torch.dtype) -> PagedCacheSpec:
        self.layer_name = layer_name
        return PagedCacheSpec(layer_name, self.num_kv_heads, self.head_size, dtype, num_parts=2,
                              sliding_window=self.options.sliding_window, features=self.options.features())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, heads*D] or [T, heads, D]; returns [T, heads*D]."""
        ctx = get_forward_context()
        if self.kv_cache is None:
            raise RuntimeError(f"attention layer {self.layer_name or '?'} has no KV cache bound")
        q = q.view(-1, self.num_heads, self.head_size)
        k = k.view(-1, self.num_kv_heads, self.head_size)
        v = v.view(-1, self.num_kv_heads, self.head_size)
        md = ctx.attn_metadata.for_group(self.kv_cache_group) if self.kv_cache_group else ctx.attn_metadata
        scaled = {"kv_scale": self.kv_scale} if is_fp8(self.kv_cache.dtype) else {}
        ctx.backend.write_kv(self.kv_cache, k, v, md, **scaled)
        if self.options.is_plain:
            out = ctx.backend.forward(q, self.kv_cache, md, self.scale, **scaled)
        else:
            out = ctx.backend.forward(q, self.kv_cache, md, self.scale, options=self.options, sinks=self.sinks,
                                      **scaled)
        return out.reshape(q.shape[0], self.num_heads * self.head_size)
