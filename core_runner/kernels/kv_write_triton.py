"""Scatter of new K/V rows into the paged cache (Triton twin of ``write_kv_ref``).

One program stores a tile of kv heads of one token: the token's slot is read once,
and every head vector is a contiguous run in both source and cache, so the stores
are coalesced. A slot < 0 (padding) turns the whole program into masked no-ops
instead of a branch, which keeps it free of host reads and safe in CUDA graphs.
Addresses are formed in int64 because a large cache exceeds 2**31 elements.
An fp8 cache (``kv_cache_dtype``, docs/fp8_kv_cache.md) gets values saturated to the
format's finite range first: a cast of an out-of-range value to e4m3fn gives NaN. With
``kv_scale`` (float32 [2] on the device: k, v) values are divided by their scale before
(IEEE division, as the torch reference divides); the scales are loaded in the kernel, so a
graph replays with whatever values the buffer holds.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kv_cache_dtype import saturation


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, scale_ptr,
    num_kv_heads, head_size,
    s_kt, s_kh, s_kd,
    s_vt, s_vh, s_vd,
    s_cb, s_co, s_ch, s_cd,
    BLOCK_SIZE: tl.constexpr,
    HEAD_TILE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_V: tl.constexpr,
    SAT: tl.constexpr,
    HAS_SCALE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HEAD_TILE + tl.arange(0, HEAD_TILE)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    # (h * 0 + slot): a scalar-vs-block `&` breaks Triton's CPU interpreter
    h_ok = (h < num_kv_heads) & ((h * 0 + slot) >= 0)
    mask = h_ok[:, None] & (d[None, :] < head_size)
    # For slot < 0 the address below is bogus but never touched (fully masked).
    dst = (slot // BLOCK_SIZE) * s_cb + (slot % BLOCK_SIZE) * s_co + h[:, None] * s_ch + d[None, :] * s_cd
    k = tl.load(k_ptr + tok * s_kt + h[:, None] * s_kh + d[None, :] * s_kd, mask=mask)
    if HAS_SCALE:
        k = tl.math.div_rn(k.to(tl.float32), tl.load(scale_ptr))
    if SAT > 0:
        k = tl.minimum(tl.maximum(k.to(tl.float32), -SAT), SAT)
    tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
    if HAS_V:
        v = tl.load(v_ptr + tok * s_vt + h[:, None] * s_vh + d[None, :] * s_vd, mask=mask)
        if HAS_SCALE:
            v = tl.math.div_rn(v.to(tl.float32), tl.load(scale_ptr + 1))
        if SAT > 0:
            v = tl.minimum(tl.maximum(v.to(tl.float32), -SAT), SAT)
        tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv_triton(
    kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None, slot_mapping: torch.Tensor,
    kv_scale: torch.Tensor | None = None,
) -> None:
    """kv_cache: [num_parts, num_blocks, block_size, kv_heads, head_size] (num_parts 1
    or 2); k, v: [num_tokens, kv_heads, head_size], any strides (e.g. views of a fused
    qkv output); slot_mapping: [num_tokens] int32/int64, flat slot or -1 to skip.
    With one part only K is stored and ``v`` may be None. ``kv_scale``: float32 [2] (k, v)
    on the cache's device; stored values are divided by it."""
    num_parts, _, block_size, kv_heads, head_size = kv_cache.shape
    num_tokens = k.shape[0]
    if slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {num_tokens} tokens")
    if tuple(k.shape[1:]) != (kv_heads, head_size):
        raise ValueError(f"k shape {tuple(k.shape)} does not match cache heads/size {(kv_heads, head_size)}")
    has_v = num_parts > 1
    if has_v and (v is None or v.shape != k.shape):
        raise ValueError("v must have k's shape when the cache stores V")
    if kv_scale is not None and (kv_scale.dtype != torch.float32 or kv_scale.numel() != 2):
        raise ValueError(f"kv_scale must be float32 with 2 entries (k, v), got {kv_scale.dtype} "
                         f"{tuple(kv_scale.shape)}")
    if num_tokens == 0:
        return
    if not has_v:
        v = k  # unused; any valid pointer
    slot_mapping = slot_mapping.contiguous()
    kc, vc = kv_cache[0], kv_cache[num_parts - 1]
    block_d = max(triton.next_power_of_2(head_size), 16)
    head_tile = min(triton.next_power_of_2(kv_heads), max(1, 4096 // block_d))
    grid = (num_tokens, triton.cdiv(kv_heads, head_tile))
    _write_kv_kernel[grid](
        k, v, kc, vc, slot_mapping, kv_scale if kv_scale is not None else slot_mapping,
        kv_heads, head_size,
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        kc.stride(0), kc.stride(1), kc.stride(2), kc.stride(3),
        BLOCK_SIZE=block_size, HEAD_TILE=head_tile, BLOCK_D=block_d, HAS_V=has_v,
        SAT=saturation(kv_cache.dtype), HAS_SCALE=kv_scale is not None, num_warps=4,
    )
