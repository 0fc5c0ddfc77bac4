"""The MLA attention layer: a latent KV cache (one vector per token) and absorbed kv_b_proj.

A model computes, per token, the query halves q_nope [H, nope] and q_pe [H, R] (roped),
the normalised latent kv_c [L] and the roped shared key k_pe [R]; it passes them with
the kv_b_proj weight ([H * (nope + v), L], rows per head: nope key rows then v rows).
The layer writes [kv_c | k_pe] into its cache, absorbs the key half of kv_b_proj into
the query (q_c = W_UK^T q_nope), attends over the latent cache through the step's
backend (``forward_mla``) and maps the latent output through the value half (W_UV).

Its cache is a PagedCacheSpec(num_parts=1, num_heads=1, head_size=L + R): the memory per
token is (kv_lora_rank + qk_rope_head_dim) x dtype size, not per head.

Under tensor parallelism ``num_heads`` is the rank's head count and kv_b_proj's weight
the rank's heads' rows; the latent is shared by all heads, so every rank writes and
reads the same full latent cache.

``kv_scale`` (float32 [2], a device buffer, as ``Attention``'s): an fp8 latent cache stores
``[kv_c | k_pe] / kv_scale[0]`` and reads ``entry * kv_scale[0]`` (one scale for the latent,
vLLM's k_scale); ``kv_scale[1]`` is unused. Passed to the backend only with an fp8 cache.
"""
from __future__ import annotations

import torch
from torch import nn

from core_runner.forward_context import get_forward_context
from core_runner.kv_cache_dtype import is_fp8
from core_runner.kv_cache_spec import PagedCacheSpec


class MLAAttention(nn.Module):
    """Multi-head latent attention (DeepSeek): caches one [kv_c | k_pe] vector per token and
    attends in the latent space with kv_b_proj absorbed (see the module docstring);
    ``forward`` returns [T, num_heads * v_head_dim]. Needs a backend with ``supports_mla``."""
    # the engine refuses, at construction, an attention backend that does not declare this
    needs_attention_capability = "supports_mla"

    def __init__(self, num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads, self.kv_lora_rank = num_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.scale = scale
        self.register_buffer("kv_scale", torch.ones(2, dtype=torch.float32), persistent=False)
        self.kv_scale_loaded: tuple[str, ...] = ()  # checkpoint tensors that set kv_scale (the loader)
        self.kv_cache: torch.Tensor | None = None
        self.layer_name = ""

    def kv_cache_spec(self, layer_name: str, dtype: torch.dtype) -> PagedCacheSpec:
        self.layer_name = layer_name
        return PagedCacheSpec(layer_name, num_heads=1, head_size=self.kv_lora_rank + self.qk_rope_head_dim,
                              dtype=dtype, num_parts=1)

    def split_kv_b(self, kv_b_weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK [H, nope, L] and W_UV [H, v, L] as views of kv_b_proj's weight."""
        w = kv_b_weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def forward(self, q_nope: torch.Tensor, q_pe: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                kv_b_weight: torch.Tensor) -> torch.Tensor:
        """q_nope [T, H, nope], q_pe [T, H, R], kv_c [T, L], k_pe [T, R] -> [T, H * v]."""
        ctx = get_forward_context()
        if self.kv_cache is None:
            raise RuntimeError(f"MLA layer {self.layer_name or '?'} has no latent cache bound")
        w_uk, w_uv = self.split_kv_b(kv_b_weight)
        scaled = {"kv_scale": self.kv_scale} if is_fp8(self.kv_cache.dtype) else {}
        ctx.backend.write_mla(self.kv_cache, kv_c, k_pe, ctx.attn_metadata, **scaled)
        q_c = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, L]
        o = ctx.backend.forward_mla(q_c, q_pe, self.kv_cache, ctx.attn_metadata, self.scale, **scaled)
        out = torch.bmm(o.transpose(0, 1), w_uv.transpose(1, 2))  # [H, T, v]
        return out.transpose(0, 1).reshape(o.shape[0], self.num_heads * self.v_head_dim)
