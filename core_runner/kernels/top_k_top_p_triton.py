"""Top-k / top-p / min-p thresholds without sorting the vocabulary (Triton twin of
``top_k_top_p_threshold_ref``; the definitions and the tie rule are documented there).

One program per row. A first pass over the row finds the max, the smallest finite
value and the number of finite tokens. The top-k and top-p thresholds are then each
found by a search on the threshold *value*, ``_search``: the answer lies in a bracket
of float order keys [kl, kh) (the condition holds at kl, fails at kh); every pass
counts, for NP pivot values inside the bracket at once, how many tokens are >= the
pivot (top-k) or how much probability mass they hold (top-p), and narrows the bracket
to the two neighbouring pivots (per-lane [BLOCK, NP] accumulators, one reduction per
pass). Pivots are spread evenly in value while the bracket is wide and enumerate keys
once it holds at most NP + 1. The search stops as soon as the bracket holds at most
CAP tokens: one more pass stores them in a scratch row, they are sorted (``tl.sort``)
and the answer is read off the sorted values with the counts / mass above the bracket
added, exactly as the reference reads it off the sorted row. (A bracket of one key,
e.g. many tokens of one value, needs no store.) Either way the result is the exact
threshold, not an approximation.

Top-p lower bound: exp(x - max) is exactly 0 in float32 below max - 104, so no
threshold below max - 128 can change the mass, and the search starts there (or at the
min-p / top-k threshold when higher, or at a value the caller knows to be below the
answer, ``lo_p``). The fused sampler (``cut_sample_triton.py``) calls ``row_threshold``
for the rare rows it cannot settle from its candidates. Only [n, CAP] scratch is
allocated, nothing of size batch x vocab.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _key(x):
    """float32 -> int64 key with the same order (-0.0 sorts just below +0.0)."""
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _value(k):
    """Inverse of ``_key``."""
    k32 = k.to(tl.int32)
    return tl.where(k32 >= 0, k32, k32 ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _search(row, vocab, inv_t, m, lo, z_lo, kh, k_min, p, cx_ptr, USE_MASS: tl.constexpr, BLOCK: tl.constexpr,
            NP: tl.constexpr, CAP: tl.constexpr):
    """Largest v >= lo with count(x >= v) >= k_min (and, with USE_MASS, mass(x >= v) >=
    p * mass(x >= z_lo), z_lo <= lo); the condition holds at lo and fails at key kh."""
    kl = _key(lo)
    j = tl.arange(0, NP) + 1
    n_in = CAP + 1  # tokens with key in [kl, kh) (unknown before the first pass)
    c_hi = 0  # count and mass of the tokens >= value(kh)
    f_hi = 0.0
    z = 0.0
    while (kh - kl > 1) & (n_in > CAP):
        dense = kh - kl <= NP + 1
        lo_f = _value(kl)
        hi_f = _value(kh)
        spread = _key(lo_f + (hi_f - lo_f) * (j.to(tl.float32) / (NP + 1)))
        spread = tl.minimum(tl.maximum(spread, kl + j), kh - (NP + 1 - j))
        pk = tl.where(dense, tl.minimum(kl + j, kh), spread)
        pv = _value(pk)
        cnt = tl.zeros([BLOCK, NP], dtype=tl.int32)
        mass = tl.zeros([BLOCK, NP], dtype=tl.float32)
        c_lo = tl.zeros([BLOCK], dtype=tl.int32)
        zz = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
            ge = x[:, None] >= pv[None, :]
            cnt += ge.to(tl.int32)
            c_lo += (x >= lo_f).to(tl.int32)
            if USE_MASS:
                e = tl.exp(x - m)  # 0 for -inf tokens
                mass += tl.where(ge, e[:, None], 0.0)
                zz += tl.where(x >= z_lo, e, 0.0)
        cnt_s = tl.sum(cnt, axis=0)
        ok = cnt_s >= k_min
        mass_s = tl.sum(mass, axis=0)
        if USE_MASS:
            z = tl.sum(zz, axis=0)
            ok = ok & (mass_s >= p * z)
        # ok holds on a prefix of the pivots (count and mass fall as the pivot rises)
        c_kl = tl.min(tl.where(ok, cnt_s, tl.sum(c_lo, axis=0)), axis=0)
        c_hi = tl.max(tl.where(ok, c_hi, cnt_s), axis=0)
        f_hi = tl.max(tl.where(ok, f_hi, mass_s), axis=0)
        n_in = c_kl - c_hi
        new_kl = tl.max(tl.where(ok, pk, kl), axis=0)
        kh = tl.min(tl.where(ok, kh, pk), axis=0)
        kl = new_kl
    v = _value(kl)
    if kh - kl > 1:
        # the n_in <= CAP tokens of the bracket, sorted: the answer is one of them
        lo_f = _value(kl)
        hi_f = _value(kh)
        n_st = 0
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
            sel = ((x >= lo_f) & (x < hi_f)).to(tl.int32)
            n_sel = tl.sum(sel, axis=0)
            if n_sel > 0:
                at = n_st + tl.cumsum(sel, axis=0) - 1
                tl.store(cx_ptr + at, x, mask=(sel > 0) & (at < CAP), cache_modifier=".cg")
            n_st += n_sel
        tl.debug_barrier()  # stored by other threads
        offs = tl.arange(0, CAP)
        valid = offs < n_st  # == n_in <= CAP
        s = tl.sort(tl.load(cx_ptr + offs, mask=valid, other=-float("inf"), cache_modifier=".cg"), dim=0,
                    descending=True)
        if USE_MASS:
            cum = f_hi + tl.cumsum(tl.where(valid, tl.exp(s - m), 0.0), axis=0)
            target = p * z
        else:
            cum = (c_hi + offs + 1).to(tl.float32)
            target = k_min.to(tl.float32)
        first = tl.sum((valid & (cum < target)).to(tl.int32), axis=0)
        if first < n_st:
            v = tl.max(tl.where(offs == first, s, -float("inf")), axis=0)
    return v


@triton.jit
def row_threshold(row, vocab, inv_t, k, p, lmp, m, mn, n_fin, lo_k, lo_p, cx_ptr, BLOCK: tl.constexpr,
                  NP: tl.constexpr, CAP: tl.constexpr):
    """The row's threshold given its max m, smallest finite value mn and number of finite
    values n_fin (all of x = logit * inv_t, n_fin > 0). lo_k <= v_k and (when t >= the
    min-p / top-k threshold) lo_p <= v_p are optional hints (mn and -inf: none)."""
    kh = _key(m) + 1  # no token is >= the next float above the max
    b = m + lmp  # -inf when min_p is off
    if (k > 0) & (k < n_fin):
        b = tl.maximum(b, _search(row, vocab, inv_t, m, tl.maximum(lo_k, mn), mn, kh, k, 0.0, cx_ptr, False, BLOCK,
                                  NP, CAP))
    if p < 1.0:
        lo = tl.maximum(tl.maximum(b, lo_p), tl.maximum(mn, m - 128.0))
        b = tl.maximum(b, _search(row, vocab, inv_t, m, lo, b, kh, 0, p, cx_ptr, True, BLOCK, NP, CAP))
    return b


@triton.jit
def _threshold_kernel(
    logits_ptr, s_row, inv_t_ptr, top_k_ptr, top_p_ptr, lmp_ptr, cand_ptr, out_ptr, vocab,
    BLOCK: tl.constexpr, NP: tl.constexpr, CAP: tl.constexpr,
):
    i = tl.program_id(0)
    row = logits_ptr + i.to(tl.int64) * s_row
    inv_t = tl.load(inv_t_ptr + i)
    k = tl.load(top_k_ptr + i)
    p = tl.load(top_p_ptr + i)
    lmp = tl.load(lmp_ptr + i)
    thr = -float("inf")
    if inv_t > 0:
        lanes = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], -float("inf"), tl.float32)
        mn = tl.full([BLOCK], float("inf"), tl.float32)
        nf = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, vocab, BLOCK):
            cols = start + lanes
            x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
            fin = x > -float("inf")
            m = tl.maximum(m, x)
            mn = tl.minimum(mn, tl.where(fin, x, float("inf")))
            nf += fin.to(tl.int32)
        n_fin = tl.sum(nf, axis=0)
        if n_fin > 0:
            mn_r = tl.min(mn, axis=0)
            thr = row_threshold(row, vocab, inv_t, k, p, lmp, tl.max(m, axis=0), mn_r, n_fin, mn_r, -float("inf"),
                                cand_ptr + i.to(tl.int64) * CAP, BLOCK, NP, CAP)
    tl.store(out_ptr + i, thr)


def top_k_top_p_threshold_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    log_min_p: torch.Tensor, block: int = 256, num_pivots: int = 16, cap: int = 1024, num_warps: int = 8,
) -> torch.Tensor:
    """Same contract as ``top_k_top_p_threshold_ref``: [n, V] -> [n] float32 thresholds."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        cand = torch.empty((n, cap), dtype=torch.float32, device=logits.device)
        _threshold_kernel[(n,)](
            logits, logits.stride(0), inv_temp.float().contiguous(), top_k.to(torch.int32).contiguous(),
            top_p.float().contiguous(), log_min_p.float().contiguous(), cand, out, vocab,
            BLOCK=block, NP=num_pivots, CAP=cap, num_warps=num_warps,
        )
    return out
