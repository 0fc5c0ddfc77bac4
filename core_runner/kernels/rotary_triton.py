"""Rotary position embedding, rotate-half or interleaved layout (Triton twin of
``layers.rotary``).

One launch ropes q [T, Hq, D] and k [T, Hk, D]: program (t, j) takes a tile of heads of
token t, q tiles first then k tiles, reads the token's cos/sin row once and writes
``x1 * cos - x2 * sin`` where x1 was and ``x2 * cos + x1 * sin`` where x2 was, to new
contiguous outputs. The pairs (x1, x2) are features (i, i + rotary_dim/2) in the
rotate-half layout (``IS_NEOX``) and (2i, 2i + 1) in the interleaved one (GPT-J,
DeepSeek). Features past ``rotary_dim`` (when rotary_dim < head_size) are copied through.
Inputs may have strided rows/heads (views of a fused qkv output); only the last dim must
be contiguous.

The math is the reference's: fp32 products, one rounding each, then one cast to the input
dtype (fp fusion is turned off so no FMA merges a product into the add). The grid comes
from host ints and no argument depends on T, so batch-size changes never recompile and
the launch is safe inside CUDA graphs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_tile(src_ptr, dst_ptr, tok, h0, n_heads, s_t, s_h, cos, sin,
               HALF, ROT, D,
               HEAD_TILE: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
               IS_NEOX: tl.constexpr):
    h = h0 + tl.arange(0, HEAD_TILE)
    j = tl.arange(0, BLOCK_HALF)
    h_ok = h < n_heads
    mask = h_ok[:, None] & (j < HALF)[None, :]
    src_row = src_ptr + tok * s_t + h[:, None].to(tl.int64) * s_h
    dst_row = dst_ptr + (tok * n_heads + h[:, None].to(tl.int64)) * D
    if IS_NEOX:
        off1 = j[None, :]
        off2 = off1 + HALF
    else:
        off1 = 2 * j[None, :]
        off2 = off1 + 1
    x1 = tl.load(src_row + off1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src_row + off2, mask=mask, other=0.0).to(tl.float32)
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst_row + off1, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
    tl.store(dst_row + off2, (x2 * cos + x1 * sin).to(out_ty), mask=mask)
    if BLOCK_REST > 0:  # features past rotary_dim pass through unchanged
        r = tl.arange(0, BLOCK_REST)
        rmask = h_ok[:, None] & (r < D - ROT)[None, :]
        rest = tl.load(src_row + ROT + r[None, :], mask=rmask)
        tl.store(dst_row + ROT + r[None, :], rest, mask=rmask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, qo_ptr, ko_ptr, pos_ptr, cs_ptr,
    n_q_heads, n_k_heads, HALF, ROT, D,
    s_qt, s_qh, s_kt, s_kh, s_cs,
    N_Q_TILES,
    HEAD_TILE: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr,
    IS_NEOX: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    j = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cs_ptr + pos * s_cs + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cs_ptr + pos * s_cs + HALF + j, mask=j < HALF, other=0.0).to(tl.float32)[None, :]
    if tile < N_Q_TILES:
        _rope_tile(q_ptr, qo_ptr, tok, tile * HEAD_TILE, n_q_heads, s_qt, s_qh, cos, sin,
                   HALF, ROT, D, HEAD_TILE, BLOCK_HALF, BLOCK_REST, IS_NEOX)
    else:
        _rope_tile(k_ptr, ko_ptr, tok, (tile - N_Q_TILES) * HEAD_TILE, n_k_heads, s_kt, s_kh, cos, sin,
                   HALF, ROT, D, HEAD_TILE, BLOCK_HALF, BLOCK_REST, IS_NEOX)


def rotary_triton(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor, rotary_dim: int,
    is_neox_style: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [T] int32/int64; q: [T, Hq, D], k: [T, Hk, D] (last dim contiguous, rows
    may be strided); cos_sin: [max_pos, rotary_dim], cos in the first half, sin in the
    second; ``is_neox_style`` False rotates interleaved pairs. Returns new contiguous
    (q_out, k_out) in q's and k's dtypes."""
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"q {tuple(q.shape)} / k {tuple(k.shape)} must be [T, heads, D] with equal T and D")
    T, n_q, D = q.shape
    n_k = k.shape[1]
    if positions.shape != (T,) or rotary_dim % 2 or not 0 < rotary_dim <= D:
        raise ValueError(f"positions {tuple(positions.shape)} / rotary_dim {rotary_dim} do not fit q {tuple(q.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError("rotary needs a contiguous last dim")
    if cos_sin.dim() != 2 or cos_sin.shape[1] != rotary_dim or cos_sin.stride(1) != 1:
        raise ValueError(f"cos_sin must be [max_pos, {rotary_dim}] with a contiguous last dim")
    positions = positions.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if T == 0:
        return q_out, k_out
    half = rotary_dim // 2
    block_half = max(triton.next_power_of_2(half), 16)
    block_rest = max(triton.next_power_of_2(D - rotary_dim), 16) if D > rotary_dim else 0
    head_tile = min(triton.next_power_of_2(max(n_q, n_k)), max(1, 1024 // block_half))
    n_q_tiles = triton.cdiv(n_q, head_tile)
    grid = (T, n_q_tiles + triton.cdiv(n_k, head_tile))
    _rotary_kernel[grid](
        q, k, q_out, k_out, positions, cos_sin,
        n_q, n_k, half, rotary_dim, D,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin.stride(0),
        n_q_tiles,
        HEAD_TILE=head_tile, BLOCK_HALF=block_half, BLOCK_REST=block_rest, IS_NEOX=bool(is_neox_style),
        num_warps=4, enable_fp_fusion=False,
    )
    return q_out, k_out
