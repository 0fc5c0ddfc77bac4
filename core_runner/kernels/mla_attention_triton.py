"""MLA attention over a paged latent cache (Triton twin of ``mla_attention_ref``).

The cache keeps one vector per token: the compressed latent c (kv_lora_rank = L) and
the shared rope key k_pe (R): ``[1, num_blocks, block_size, 1, L + R]``. With kv_b_proj
absorbed, every query head attends as in multi-query attention:
  score(h, j) = q_c[h] . c_j + q_pe[h] . k_pe_j,   out[h] = sum_j p(h, j) c_j   (L wide)
so the value is the latent itself: each key tile is loaded once and used for both the
scores and the output, and decode reads nothing but the latent cache.

Layout of the work (as in ``paged_attention``): a program owns BLOCK_Q query tokens of
one request and BLOCK_H heads (BLOCK_M = BLOCK_Q * BLOCK_H rows, >= 16 for tensor cores);
grid axis 1 tiles the heads. When every request fits one query block (decode), program
i serves request i; otherwise request i starts at program ``qsl[i] // BLOCK_Q + i`` and a
program finds its request by binary search over query_start_loc. The grid comes from
host ints only, so the launch can be captured in a CUDA graph; the output is zeroed
first so padding tokens (past qsl[-1]) read as zeros.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.request_lookup_triton import request_of_program

_LOG2E = 1.4426950408889634
_NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit(do_not_specialize=["num_reqs"])
def _mla_kernel(
    qc_ptr, qpe_ptr, cache_ptr, out_ptr, qsl_ptr, seq_lens_ptr, bt_ptr,
    num_reqs, qk_scale,
    s_qt, s_qh, s_pt, s_ph, s_ot, s_oh, s_bt, s_cb, s_co,
    NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, LORA: tl.constexpr, BLOCK_L: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr, ONE_BLOCK_PER_REQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * BLOCK_H
    pid = tl.program_id(0)
    hblk = tl.program_id(1)
    req, tok0 = request_of_program(qsl_ptr, pid, num_reqs, BLOCK_Q, ONE_BLOCK_PER_REQ)
    q_end = tl.load(qsl_ptr + req + 1)
    seq_len = tl.load(seq_lens_ptr + req)
    n_tok = tl.minimum(q_end - tok0, BLOCK_Q)
    pos0 = seq_len - (q_end - tok0)
    kv_end = tl.maximum(tl.where(n_tok > 0, tl.minimum(seq_len, pos0 + n_tok), 0), 0)

    rows = tl.arange(0, BLOCK_M)
    r_tok = rows // BLOCK_H
    r_head = hblk * BLOCK_H + rows % BLOCK_H
    row_ok = (r_tok < n_tok) & (r_head < NUM_HEADS)
    r_pos = pos0 + r_tok
    tok = (tok0 + r_tok).to(tl.int64)
    lcol = tl.arange(0, BLOCK_L)
    rcol = tl.arange(0, BLOCK_R)
    l_ok = lcol < LORA
    r_ok = rcol < ROPE

    q_c = tl.load(qc_ptr + tok[:, None] * s_qt + r_head[:, None] * s_qh + lcol[None, :],
                  mask=row_ok[:, None] & l_ok[None, :], other=0.0)
    q_pe = tl.load(qpe_ptr + tok[:, None] * s_pt + r_head[:, None] * s_ph + rcol[None, :],
                   mask=row_ok[:, None] & r_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_L], dtype=tl.float32)
    bt_row = bt_ptr + req.to(tl.int64) * s_bt
    for start in range(0, kv_end, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < kv_end
        blk = tl.load(bt_row + n // BLOCK_SIZE, mask=n_ok, other=0)
        off = blk.to(tl.int64) * s_cb + (n % BLOCK_SIZE) * s_co
        c = tl.load(cache_ptr + off[:, None] + lcol[None, :], mask=n_ok[:, None] & l_ok[None, :], other=0.0)
        pe = tl.load(cache_ptr + off[:, None] + LORA + rcol[None, :], mask=n_ok[:, None] & r_ok[None, :],
                     other=0.0)
        c = c.to(q_c.dtype)
        s = tl.dot(q_c, tl.trans(c), input_precision=DOT_PRECISION)
        s += tl.dot(q_pe, tl.trans(pe.to(q_pe.dtype)), input_precision=DOT_PRECISION)
        s = s * qk_scale
        keep = n_ok[None, :] & (n[None, :] <= r_pos[:, None])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c, input_precision=DOT_PRECISION)
        m_i = m_new

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + tok[:, None] * s_ot + r_head[:, None] * s_oh + lcol[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & l_ok[None, :])


def mla_attention_triton(
    q_c: torch.Tensor,
    q_pe: torch.Tensor,
    latent_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int | None = None,
) -> torch.Tensor:
    """q_c: [T, H, L] (q_nope with kv_b_proj's key half absorbed); q_pe: [T, H, R] (roped);
    latent_cache: [1, num_blocks, block_size, 1, L + R]. Returns [T, H, L] in q_c's dtype.
    ``max_query_len`` is a host-side bound; pass it under CUDA graphs (else the device is read)."""
    num_tokens, num_heads, lora = q_c.shape
    rope = q_pe.shape[-1]
    parts, _, block_size, cache_heads, width = latent_cache.shape
    if parts != 1 or cache_heads != 1 or width != lora + rope or q_pe.shape[:2] != q_c.shape[:2]:
        raise ValueError(f"q_c {tuple(q_c.shape)} / q_pe {tuple(q_pe.shape)} do not fit the latent cache "
                         f"{tuple(latent_cache.shape)} (expected [1, blocks, block_size, 1, L + R])")
    if latent_cache.stride(-1) != 1:
        raise ValueError("latent_cache must be contiguous in its last dimension")
    q_c = q_c if q_c.stride(-1) == 1 else q_c.contiguous()
    q_pe = q_pe if q_pe.stride(-1) == 1 else q_pe.contiguous()
    out = torch.zeros((num_tokens, num_heads, lora), dtype=q_c.dtype, device=q_c.device)
    num_reqs = seq_lens.shape[0]
    if num_tokens == 0 or num_reqs == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    block_h = min(triton.next_power_of_2(num_heads), 16)
    block_q = max(16 // block_h, 1)
    one_block = max_query_len <= block_q
    num_progs = num_reqs if one_block else num_tokens // block_q + num_reqs
    block_l = max(triton.next_power_of_2(lora), 16)
    block_r = max(triton.next_power_of_2(rope), 16)
    block_n = 32 if block_l * latent_cache.element_size() <= 1024 else 16
    on_cuda = q_c.device.type == "cuda"
    cache = latent_cache[0]
    _mla_kernel[(num_progs, triton.cdiv(num_heads, block_h))](
        q_c, q_pe, cache, out, query_start_loc, seq_lens, block_tables,
        num_reqs, scale * _LOG2E,
        q_c.stride(0), q_c.stride(1), q_pe.stride(0), q_pe.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), cache.stride(0), cache.stride(1),
        NUM_HEADS=num_heads, BLOCK_H=block_h, BLOCK_Q=block_q, BLOCK_SIZE=block_size, BLOCK_N=block_n,
        LORA=lora, BLOCK_L=block_l, ROPE=rope, BLOCK_R=block_r, ONE_BLOCK_PER_REQ=one_block,
        DOT_PRECISION="ieee" if q_c.dtype == torch.float32 else "tf32",
        num_warps=4, num_stages=2 if on_cuda else 1,
    )
    return out
