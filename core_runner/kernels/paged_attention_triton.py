"""Paged attention for mixed prefill/decode batches in one launch (Triton twin of
``paged_attention_ref``).

Layout of the work. A program owns one *query block* of one request and one kv
head: BLOCK_Q consecutive query tokens times the GROUP query heads that share the
kv head, packed into BLOCK_M = BLOCK_Q * GROUP_PAD rows. Each K/V tile is thus
loaded once for the whole GQA group, and decode rows (1 token) still fill a
tensor-core tile of at least 16 rows. K/V are gathered token by token through the
block table, so any block size works and a tile of BLOCK_N tokens spans
BLOCK_N / block_size physical blocks.

Finding the request without host reads. The grid is sized from host ints only
(num_tokens, num_reqs, max_query_len) so the launch can be captured in a CUDA
graph. When every request fits in one query block (decode, short spec-decode),
program i simply serves request i. Otherwise request i is given the program ids
starting at ``qsl[i] // BLOCK_Q + i`` (at least ceil(q_len / BLOCK_Q) of them, at
most num_tokens // BLOCK_Q + num_reqs in all) and each program finds its request by
binary search over query_start_loc. Extra programs cover the padding tokens past
``qsl[-1]``: they run as requests with no context and write zeros, so no output
row is ever left uninitialised.

Split-KV (flash-decoding). With few (request, kv head) pairs the GPU would idle, so
a third grid axis splits each context into num_splits ranges; each writes its
running (max, sum, unnormalised acc) to scratch and a small second kernel merges
them. The split count is chosen from host ints, never from device values.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.request_lookup_triton import request_of_program
from core_runner.kernels.split_kv_triton import (
    merge_splits,
    pick_num_splits,
    split_range,
    split_range_from,
    split_scratch,
)

_LOG2E = 1.4426950408889634
_NEG_BIG = tl.constexpr(-1.0e30)  # finite "minus infinity": keeps exp2(m_old - m_new) NaN-free


@triton.jit
def _attend_tile(
    q, m_i, l_i, acc, start, kv_hi, r_pos, bt_row, kc_ptr, vc_ptr, kv_head_off, s_cb, s_co, qk_scale,
    window, cap_log2e,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_SIZE: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    WINDOWED: tl.constexpr, SOFT_CAP: tl.constexpr,
):
    """One online-softmax step over keys [start, start + BLOCK_N), gathered per token
    through the block table. MASKED=False promises every key is in range and visible.
    SOFT_CAP: qk_scale is scale / cap, and the scores become tanh(.) * cap (in log2 units
    through cap_log2e). WINDOWED: row r sees keys above r_pos - window."""
    n = start + tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    n_ok = n < kv_hi
    if MASKED:
        blk = tl.load(bt_row + n // BLOCK_SIZE, mask=n_ok, other=0)
        kv_mask = n_ok[:, None] & (d < HEAD_SIZE)[None, :]
    else:
        blk = tl.load(bt_row + n // BLOCK_SIZE)
        kv_mask = (d < HEAD_SIZE)[None, :]  # folds away when BLOCK_D == HEAD_SIZE
    kv_off = blk.to(tl.int64) * s_cb + (n % BLOCK_SIZE) * s_co + kv_head_off
    k = tl.load(kc_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(vc_ptr + kv_off[:, None] + d[None, :], mask=kv_mask, other=0.0)
    s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION) * qk_scale
    if SOFT_CAP:  # tanh(x) = 1 - 2 / (exp(2x) + 1): saturates to +-1 without NaN
        s = (1.0 - 2.0 / (tl.exp(2.0 * s) + 1.0)) * cap_log2e
    if MASKED:
        keep = n_ok[None, :]
        if CAUSAL:
            keep = keep & (n[None, :] <= r_pos[:, None])
        if WINDOWED:
            keep = keep & (n[None, :] > r_pos[:, None] - window)
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype), input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["num_tokens", "num_reqs", "num_main"])
def _attn_kernel(
    q_ptr, kc_ptr, vc_ptr, out_ptr, m_ptr, l_ptr, acc_ptr,
    qsl_ptr, seq_lens_ptr, bt_ptr, sinks_ptr, kv_scale_ptr,
    num_tokens, num_reqs, num_main, qk_scale, window, cap_log2e,
    s_qt, s_qh, s_ot, s_oh, s_bt,
    s_cb, s_co, s_ch,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, HEAD_SIZE: tl.constexpr, ONE_BLOCK_PER_REQ: tl.constexpr, CAUSAL: tl.constexpr,
    NUM_SPLITS: tl.constexpr, DOT_PRECISION: tl.constexpr, UNMASKED_LOOP: tl.constexpr,
    WINDOWED: tl.constexpr, SOFT_CAP: tl.constexpr, HAS_SINKS: tl.constexpr, HAS_KV_SCALE: tl.constexpr,
    FP16_DOT: tl.constexpr,
):
    BLOCK_Q: tl.constexpr = BLOCK_M // GROUP_PAD
    # Reversed so the heaviest work starts first: prefills sit after the decode rows
    # and a request's last query blocks see the most keys.
    pid = tl.num_programs(0) - 1 - tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    # ---- which tokens this program serves: [tok0, q_end) capped at BLOCK_Q, ctx seq_len
    if pid < num_main:
        req, tok0 = request_of_program(qsl_ptr, pid, num_reqs, BLOCK_Q, ONE_BLOCK_PER_REQ)
        q_end = tl.load(qsl_ptr + req + 1)
        seq_len = tl.load(seq_lens_ptr + req)
    else:  # padding tokens past qsl[-1]: an empty context, so zeros are written
        req = pid * 0
        tok0 = tl.load(qsl_ptr + num_reqs) + (pid - num_main) * BLOCK_Q
        q_end = req + num_tokens
        seq_len = req
    n_tok = tl.minimum(q_end - tok0, BLOCK_Q)
    pos0 = seq_len - (q_end - tok0)  # absolute position of token tok0

    if CAUSAL:
        kv_end = tl.minimum(seq_len, pos0 + n_tok)
    else:
        kv_end = seq_len
    kv_end = tl.maximum(tl.where(n_tok > 0, kv_end, 0), 0)
    if WINDOWED:  # keys before the first row's window are never loaded: their blocks may be freed
        kv_lo, kv_hi = split_range_from(tl.minimum(tl.maximum(pos0 - window + 1, 0), kv_end), kv_end, split,
                                        NUM_SPLITS, BLOCK_N)
    else:
        kv_lo, kv_hi = split_range(kv_end, split, NUM_SPLITS, BLOCK_N)

    # ---- rows: (token, head within group)
    rows = tl.arange(0, BLOCK_M)
    r_tok = rows // GROUP_PAD
    r_head = kvh * GROUP + rows % GROUP_PAD
    row_ok = (r_tok < n_tok) & (rows % GROUP_PAD < GROUP)
    r_pos = pos0 + r_tok
    tok = (tok0 + r_tok).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_SIZE

    q = tl.load(q_ptr + tok[:, None] * s_qt + r_head[:, None] * s_qh + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], _NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    kv_head_off = kvh.to(tl.int64) * s_ch
    bt_row = bt_ptr + req.to(tl.int64) * s_bt
    # fp8 cache scales: q.(k_scale k) = k_scale (q.k), and sum p (v_scale v) = v_scale sum p v,
    # so the k scale joins the score scale and the v scale multiplies the accumulator once
    k_scale = 1.0
    if HAS_KV_SCALE:
        k_scale = tl.load(kv_scale_ptr)
    if FP16_DOT:  # fp8 keys and values become fp16 in one conversion (bf16 takes three); q carries
        # the softmax scale into fp16 (|q| / sqrt(D) stays far inside fp16's range), while the
        # k scale, which may be small, multiplies the scores after the product
        q = (q.to(tl.float32) * qk_scale).to(tl.float16)
        qk_scale = k_scale
    else:
        qk_scale = qk_scale * k_scale

    # Keys below pos0 + 1 are visible to every row, so whole tiles there can skip all
    # masks. That pays for prefill tiles but slows decode (two pipelined loops instead of
    # one), hence the switch (figures in benchmarks/RESULTS.md).
    full_end = kv_lo
    if UNMASKED_LOOP and not WINDOWED:
        if CAUSAL:
            full_end = tl.minimum(pos0 + 1, kv_hi)
        else:
            full_end = kv_hi
        full_end = kv_lo + (tl.maximum(full_end - kv_lo, 0) // BLOCK_N) * BLOCK_N
        for start in range(kv_lo, full_end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q, m_i, l_i, acc, start, kv_hi, r_pos, bt_row, kc_ptr, vc_ptr, kv_head_off, s_cb, s_co,
                qk_scale, window, cap_log2e, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_SIZE, False, CAUSAL, DOT_PRECISION,
                WINDOWED, SOFT_CAP)
    for start in range(full_end, kv_hi, BLOCK_N):
        m_i, l_i, acc = _attend_tile(
            q, m_i, l_i, acc, start, kv_hi, r_pos, bt_row, kc_ptr, vc_ptr, kv_head_off, s_cb, s_co,
            qk_scale, window, cap_log2e, BLOCK_SIZE, BLOCK_N, BLOCK_D, HEAD_SIZE, True, CAUSAL, DOT_PRECISION,
            WINDOWED, SOFT_CAP)
    if HAS_KV_SCALE:  # before the split scratch: the merge is linear in acc
        acc = acc * tl.load(kv_scale_ptr + 1)

    if HAS_SINKS:  # a key with a learned logit and a zero value, counted once (by split 0)
        sink = tl.load(sinks_ptr + r_head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        sink = tl.where(split == 0, sink, _NEG_BIG)
        m_new = tl.maximum(m_i, sink)
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.exp2(sink - m_new)
        acc = acc * alpha[:, None]
        m_i = m_new
    if NUM_SPLITS > 1:
        part = (tok * NUM_HEADS + r_head) * NUM_SPLITS + split
        tl.store(m_ptr + part, m_i, mask=row_ok)
        tl.store(l_ptr + part, l_i, mask=row_ok)
        tl.store(acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=row_ok[:, None])
    else:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        o = acc / l_safe[:, None]
        tl.store(out_ptr + tok[:, None] * s_ot + r_head[:, None] * s_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _launch_config(max_query_len: int, group_pad: int, block_d: int, elem_bytes: int,
                   device: torch.device) -> dict:
    """Tiles and warps chosen by measurement (bf16, D=128; benchmarks/RESULTS.md): decode-like batches take
    16-row tiles (one token x group, padded), anything longer 64-row tiles; K+V tiles
    stay <= 32 KiB per pipeline stage (fp32, used by tests, gets narrower tiles). Decode
    runs two stages: from CUDA graphs on the H200 (benchmarks/attn_sweep.py; benchmarks/RESULTS.md),
    1,024 x ~220-token contexts 231 us vs 238 in three stages, 40 x ~1,600 73 vs 85, 256 x
    ~650 179 vs 178."""
    block_n = 64 if block_d * elem_bytes <= 256 else 32
    if max_query_len * group_pad <= 16:
        cfg = {"BLOCK_M": 16, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2, "UNMASKED_LOOP": False}
        if elem_bytes == 1 and device.type == "cuda":
            # an fp8 cache's operands go through shared memory and a conversion, which takes
            # ~184 registers a thread uncapped (bf16: 96): two programs an SM instead of four.
            # Capped at 128 the decode step at W1 shapes took 240 us instead of 326 (bf16: 308;
            # benchmarks/attn_sweep.py --kv-dtype fp8 on the H100)
            cfg["maxnreg"] = 128
    else:
        cfg = {"BLOCK_M": 64, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2, "UNMASKED_LOOP": True}
    cfg["BLOCK_M"] = max(cfg["BLOCK_M"], group_pad)
    if device.type != "cuda":
        cfg["num_stages"] = 1
    return cfg


def paged_attention_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    causal: bool = True,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    config: dict | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    sinks: torch.Tensor | None = None,
    kv_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [num_tokens, heads, D]; kv_cache: [1 or 2, num_blocks, block_size, kv_heads, D];
    query_start_loc: [num_reqs + 1]; seq_lens, block_tables: per request (device).
    max_query_len / max_seq_len are host-side upper bounds; only when they are None
    (and needed) is the device read, so pass them under CUDA graphs. num_splits > 1
    forces the split-KV path; None lets a heuristic choose (split only for decode).
    ``config`` overrides the launch parameters (BLOCK_M, BLOCK_N, num_warps, num_stages,
    UNMASKED_LOOP, FP16_DOT: the products in fp16, default for an fp8 cache under a 16-bit
    q; maxnreg: a register cap per thread, for occupancy): a measurement hook
    (benchmarks/attn_sweep.py). ``sliding_window``,
    ``logits_soft_cap``, ``sinks`` ([heads]) and ``kv_scale`` (float32 [2] on the device: the
    k / v cache scales) as in ``paged_attention_ref``."""
    num_tokens, num_heads, head_size = q.shape
    _, _, block_size, kv_heads, cache_d = kv_cache.shape
    if cache_d != head_size or num_heads % kv_heads != 0:
        raise ValueError(f"q {tuple(q.shape)} does not fit kv_cache {tuple(kv_cache.shape)}")
    if kv_cache.stride(-1) != 1:
        raise ValueError("kv_cache must be contiguous in head_size")
    if q.stride(-1) != 1:
        q = q.contiguous()
    num_reqs = seq_lens.shape[0]
    out = torch.empty((num_tokens, num_heads, head_size), dtype=q.dtype, device=q.device)
    if num_tokens == 0:
        return out
    if num_reqs == 0:
        return out.zero_()
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    group = num_heads // kv_heads
    group_pad = triton.next_power_of_2(group)
    block_d = max(triton.next_power_of_2(head_size), 16)
    cfg = {**_launch_config(max_query_len, group_pad, block_d, kv_cache.element_size(), q.device), **(config or {})}
    cfg["BLOCK_M"] = max(cfg["BLOCK_M"], group_pad)  # an override may ask for fewer rows than the group
    cfg.setdefault("FP16_DOT", kv_cache.element_size() == 1 and q.dtype != torch.float32)
    block_q = cfg["BLOCK_M"] // group_pad
    one_block = max_query_len <= block_q
    num_main = num_reqs if one_block else num_tokens // block_q + num_reqs
    if num_splits is None:
        num_splits = 1
        if max_query_len == 1:
            if max_seq_len is None:
                max_seq_len = int(seq_lens.max())
            span = max_seq_len if sliding_window is None else min(max_seq_len, sliding_window)
            num_splits = pick_num_splits(q.device, num_reqs, kv_heads, span)
    dot_precision = "ieee" if q.dtype == torch.float32 else "tf32"  # no TF32 rounding of fp32
    grid = (num_main + triton.cdiv(num_tokens, block_q), kv_heads, num_splits)
    m_buf, l_buf, acc_buf = split_scratch(num_tokens, num_heads, num_splits, block_d, q.device) \
        if num_splits > 1 else (out, out, out)  # unused without splits
    if sliding_window is not None and not causal:
        raise NotImplementedError("sliding_window is implemented for causal attention only")
    if sinks is not None and tuple(sinks.shape) != (num_heads,):
        raise ValueError(f"sinks {tuple(sinks.shape)} must hold one logit per head ({num_heads},)")
    if kv_scale is not None and (kv_scale.dtype != torch.float32 or kv_scale.numel() != 2):
        raise ValueError(f"kv_scale must be float32 with 2 entries (k, v), got {kv_scale.dtype} "
                         f"{tuple(kv_scale.shape)}")
    cap = logits_soft_cap
    _attn_kernel[grid](
        q, kv_cache[0], kv_cache[-1], out, m_buf, l_buf, acc_buf,
        query_start_loc, seq_lens, block_tables, sinks if sinks is not None else seq_lens,
        kv_scale if kv_scale is not None else seq_lens,
        num_tokens, num_reqs, num_main, scale / cap if cap else scale * _LOG2E,
        sliding_window or 0, cap * _LOG2E if cap else 1.0,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
        kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        NUM_HEADS=num_heads, GROUP=group, GROUP_PAD=group_pad,
        BLOCK_SIZE=block_size, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_D=block_d,
        HEAD_SIZE=head_size, ONE_BLOCK_PER_REQ=one_block, CAUSAL=causal, NUM_SPLITS=num_splits,
        DOT_PRECISION=dot_precision, UNMASKED_LOOP=cfg["UNMASKED_LOOP"],
        WINDOWED=sliding_window is not None, SOFT_CAP=cap is not None, HAS_SINKS=sinks is not None,
        HAS_KV_SCALE=kv_scale is not None, FP16_DOT=cfg["FP16_DOT"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **({"maxnreg": cfg["maxnreg"]} if cfg.get("maxnreg") else {}),
    )
    if num_splits > 1:
        merge_splits(out, (m_buf, l_buf, acc_buf), query_start_loc, num_reqs, num_splits, block_d)
    return out
