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
host ints only, so the launch can be captured in a CUDA graph; unsplit, the output is
zeroed first so padding tokens (past qsl[-1]) read as zeros.

Split-KV (flash-decoding). A decode batch gives only num_reqs x head tiles programs, each
streaming its whole context (up to ~1 MiB of latents per 1k tokens in bf16), too few to
keep an H200's 132 SMs reading. Grid axis 2 then cuts each program's context [0, kv_end)
into NUM_SPLITS BLOCK_N-aligned ranges; each program writes its running (max, sum,
unnormalised acc) to fp32 scratch indexed (token, head, split), and paged attention's
``merge_splits`` combines them and writes every output row, zeros for padding
tokens. A split with nothing to read still writes (_NEG_BIG, 0, 0), which the merge
weighs as nothing. The split count is picked from host ints (``max_seq_len``), as in
``paged_attention``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.request_lookup_triton import request_of_program
from core_runner.kernels.split_kv_triton import merge_splits, pick_num_splits, split_range, split_scratch

_LOG2E = 1.4426950408889634
_NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity": keeps exp2(m_old - m_new) NaN-free
_LAUNCH_KEYS = ("BLOCK_N", "num_warps", "num_stages")


@triton.jit(do_not_specialize=["num_reqs"])
def _mla_kernel(
    qc_ptr, qpe_ptr, cache_ptr, out_ptr, m_ptr, l_ptr, acc_ptr, qsl_ptr, seq_lens_ptr, bt_ptr, kv_scale_ptr,
    num_reqs, qk_scale,
    s_qt, s_qh, s_pt, s_ph, s_ot, s_oh, s_bt, s_cb, s_co,
    NUM_HEADS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, LORA: tl.constexpr, BLOCK_L: tl.constexpr, ROPE: tl.constexpr,
    BLOCK_R: tl.constexpr, ONE_BLOCK_PER_REQ: tl.constexpr, NUM_SPLITS: tl.constexpr,
    DOT_PRECISION: tl.constexpr, HAS_KV_SCALE: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * BLOCK_H
    pid = tl.program_id(0)
    hblk = tl.program_id(1)
    split = tl.program_id(2)
    req, tok0 = request_of_program(qsl_ptr, pid, num_reqs, BLOCK_Q, ONE_BLOCK_PER_REQ)
    q_end = tl.load(qsl_ptr + req + 1)
    seq_len = tl.load(seq_lens_ptr + req)
    n_tok = tl.minimum(q_end - tok0, BLOCK_Q)
    pos0 = seq_len - (q_end - tok0)
    kv_end = tl.maximum(tl.where(n_tok > 0, tl.minimum(seq_len, pos0 + n_tok), 0), 0)
    kv_lo, kv_hi = split_range(kv_end, split, NUM_SPLITS, BLOCK_N)

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
    # an fp8 latent reads as sigma * entry: the scores and the output are both linear in it
    if HAS_KV_SCALE:
        sigma = tl.load(kv_scale_ptr)
        qk_scale = qk_scale * sigma
    for start in range(kv_lo, kv_hi, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        n_ok = n < kv_hi
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
    if HAS_KV_SCALE:
        acc = acc * sigma

    if NUM_SPLITS > 1:
        part = (tok * NUM_HEADS + r_head) * NUM_SPLITS + split
        tl.store(m_ptr + part, m_i, mask=row_ok)
        tl.store(l_ptr + part, l_i, mask=row_ok)
        tl.store(acc_ptr + part[:, None] * BLOCK_L + lcol[None, :], acc, mask=row_ok[:, None])
    else:
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
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    config: dict | None = None,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q_c: [T, H, L] (q_nope with kv_b_proj's key half absorbed); q_pe: [T, H, R] (roped);
    latent_cache: [1, num_blocks, block_size, 1, L + R]. Returns [T, H, L] in q_c's dtype.
    ``max_query_len`` / ``max_seq_len`` are host-side upper bounds; only when they are None
    (and needed) is the device read, so pass them under CUDA graphs. num_splits > 1 forces
    split-KV; None lets a heuristic choose (decode on CUDA only). ``config`` overrides the
    launch parameters BLOCK_N, num_warps, num_stages (for tuning sweeps). ``kv_scale``: float32
    [2] on the device; the latent reads as ``entry * kv_scale[0]`` (an fp8 cache's scale)."""
    num_tokens, num_heads, lora = q_c.shape
    rope = q_pe.shape[-1]
    parts, _, block_size, cache_heads, width = latent_cache.shape
    if parts != 1 or cache_heads != 1 or width != lora + rope or q_pe.shape[:2] != q_c.shape[:2]:
        raise ValueError(f"q_c {tuple(q_c.shape)} / q_pe {tuple(q_pe.shape)} do not fit the latent cache "
                         f"{tuple(latent_cache.shape)} (expected [1, blocks, block_size, 1, L + R])")
    if latent_cache.stride(-1) != 1:
        raise ValueError("latent_cache must be contiguous in its last dimension")
    if kv_scale is not None and (kv_scale.dtype != torch.float32 or kv_scale.numel() != 2):
        raise ValueError(f"kv_scale must be float32 with 2 entries (latent, unused), got {kv_scale.dtype} "
                         f"{tuple(kv_scale.shape)}")
    if config is not None and not set(config) <= set(_LAUNCH_KEYS):
        raise ValueError(f"config keys {sorted(set(config) - set(_LAUNCH_KEYS))} are not among {_LAUNCH_KEYS}")
    q_c = q_c if q_c.stride(-1) == 1 else q_c.contiguous()
    q_pe = q_pe if q_pe.stride(-1) == 1 else q_pe.contiguous()
    num_reqs = seq_lens.shape[0]
    if num_tokens == 0 or num_reqs == 0:
        return torch.zeros((num_tokens, num_heads, lora), dtype=q_c.dtype, device=q_c.device)
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    block_h = min(triton.next_power_of_2(num_heads), 16)
    block_q = max(16 // block_h, 1)
    one_block = max_query_len <= block_q
    num_progs = num_reqs if one_block else num_tokens // block_q + num_reqs
    head_tiles = triton.cdiv(num_heads, block_h)
    if num_splits is None:
        num_splits = 1
        if max_query_len == 1 and q_c.device.type == "cuda":
            if max_seq_len is None:
                max_seq_len = int(seq_lens.max())
            num_splits = pick_num_splits(q_c.device, num_reqs, head_tiles, max_seq_len)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    block_l = max(triton.next_power_of_2(lora), 16)
    block_r = max(triton.next_power_of_2(rope), 16)
    cfg = {"BLOCK_N": 32 if block_l * latent_cache.element_size() <= 1024 else 16, "num_warps": 4,
           "num_stages": 2 if q_c.device.type == "cuda" else 1}
    cfg.update(config or {})
    if num_splits > 1:  # the merge writes every row, padding tokens included
        out = torch.empty((num_tokens, num_heads, lora), dtype=q_c.dtype, device=q_c.device)
        m_buf, l_buf, acc_buf = split_scratch(num_tokens, num_heads, num_splits, block_l, q_c.device)
    else:  # the kernel writes real tokens only
        out = torch.zeros((num_tokens, num_heads, lora), dtype=q_c.dtype, device=q_c.device)
        m_buf = l_buf = acc_buf = out  # unused
    cache = latent_cache[0]
    _mla_kernel[(num_progs, head_tiles, num_splits)](
        q_c, q_pe, cache, out, m_buf, l_buf, acc_buf, query_start_loc, seq_lens, block_tables,
        kv_scale if kv_scale is not None else seq_lens, num_reqs, scale * _LOG2E,
        q_c.stride(0), q_c.stride(1), q_pe.stride(0), q_pe.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), cache.stride(0), cache.stride(1),
        NUM_HEADS=num_heads, BLOCK_H=block_h, BLOCK_Q=block_q, BLOCK_SIZE=block_size, BLOCK_N=cfg["BLOCK_N"],
        LORA=lora, BLOCK_L=block_l, ROPE=rope, BLOCK_R=block_r, ONE_BLOCK_PER_REQ=one_block,
        NUM_SPLITS=num_splits, DOT_PRECISION="ieee" if q_c.dtype == torch.float32 else "tf32",
        HAS_KV_SCALE=kv_scale is not None, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if num_splits > 1:
        merge_splits(out, (m_buf, l_buf, acc_buf), query_start_loc, num_reqs, num_splits, block_l)
    return out
