"""Top-k / top-p / min-p thresholds without sorting the vocabulary (Triton twin of
``top_k_top_p_threshold_ref``; the definitions and the tie rule are documented there).

One program per row. A first pass over the row finds the max, the smallest finite
value and the number of finite tokens. The top-k and top-p thresholds are then each
found by a search on the threshold *value*: every further pass counts, for NP pivot
values at once, how many tokens are >= the pivot (top-k) or how much probability mass
they hold (top-p), and narrows the interval to the two neighbouring pivots. The
search runs on the ordered integer keys of float32 values, so it ends on the exact
threshold (an interval of one key), not on an approximation: pivots are spread evenly
in value while the interval is wide and enumerate keys once it holds at most NP + 1.

Top-p lower bound: exp(x - max) is exactly 0 in float32 below max - 104, so no
threshold below max - 128 can change the mass, and the search starts there (or at the
min-p / top-k threshold when higher). A pass reads the row once (row x NP compares in
registers); nothing of size batch x vocab is allocated.
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
def _search(row, vocab, inv_t, m, lo, kh, k_min, p, USE_MASS: tl.constexpr, BLOCK: tl.constexpr,
            NP: tl.constexpr):
    """Largest v >= lo with count(x >= v) >= k_min (and, with USE_MASS, mass(x >= v) >=
    p * mass(x >= lo)); the condition holds at lo and fails at key kh."""
    kl = _key(lo)
    j = tl.arange(0, NP) + 1
    while kh - kl > 1:
        dense = kh - kl <= NP + 1
        lo_f = _value(kl)
        hi_f = _value(kh)
        spread = _key(lo_f + (hi_f - lo_f) * (j.to(tl.float32) / (NP + 1)))
        spread = tl.minimum(tl.maximum(spread, kl + j), kh - (NP + 1 - j))
        pk = tl.where(dense, tl.minimum(kl + j, kh), spread)
        pv = _value(pk)
        # per-lane [BLOCK, NP] accumulators, reduced once after the pass
        cnt = tl.zeros([BLOCK, NP], dtype=tl.int32)
        mass = tl.zeros([BLOCK, NP], dtype=tl.float32)
        z = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
            ge = x[:, None] >= pv[None, :]
            cnt += ge.to(tl.int32)
            if USE_MASS:
                e = tl.exp(x - m)  # 0 for -inf tokens
                mass += tl.where(ge, e[:, None], 0.0)
                z += tl.where(x >= lo, e, 0.0)
        ok = tl.sum(cnt, axis=0) >= k_min
        if USE_MASS:
            ok = ok & (tl.sum(mass, axis=0) >= p * tl.sum(z, axis=0))
        # ok holds on a prefix of the pivots (count and mass fall as the pivot rises)
        new_kl = tl.max(tl.where(ok, pk, kl), axis=0)
        kh = tl.min(tl.where(ok, kh, pk), axis=0)
        kl = new_kl
    return _value(kl)


@triton.jit
def row_threshold(row, vocab, inv_t, k, p, lmp, m, mn, n_fin, BLOCK: tl.constexpr, NP: tl.constexpr):
    """The row's threshold given its max m, smallest finite value mn and number of finite
    values n_fin (all of x = logit * inv_t, n_fin > 0)."""
    kh = _key(m) + 1  # no token is >= the next float above the max
    b = m + lmp  # -inf when min_p is off
    if (k > 0) & (k < n_fin):
        b = tl.maximum(b, _search(row, vocab, inv_t, m, mn, kh, k, 0.0, False, BLOCK, NP))
    if p < 1.0:
        lo = tl.maximum(b, tl.maximum(mn, m - 128.0))
        b = tl.maximum(b, _search(row, vocab, inv_t, m, lo, kh, 0, p, True, BLOCK, NP))
    return b


@triton.jit
def _threshold_kernel(
    logits_ptr, s_row, inv_t_ptr, top_k_ptr, top_p_ptr, lmp_ptr, out_ptr, vocab,
    BLOCK: tl.constexpr, NP: tl.constexpr,
):
    i = tl.program_id(0)
    row = logits_ptr + i.to(tl.int64) * s_row
    inv_t = tl.load(inv_t_ptr + i)
    k = tl.load(top_k_ptr + i)
    p = tl.load(top_p_ptr + i)
    lmp = tl.load(lmp_ptr + i)
    thr = -float("inf")
    if inv_t > 0:
        m = -float("inf")
        mn = float("inf")
        n_fin = 0
        for start in range(0, vocab, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
            fin = x > -float("inf")
            m = tl.maximum(m, tl.max(x, axis=0))
            mn = tl.minimum(mn, tl.min(tl.where(fin, x, float("inf")), axis=0))
            n_fin += tl.sum(fin.to(tl.int32), axis=0)
        if n_fin > 0:
            thr = row_threshold(row, vocab, inv_t, k, p, lmp, m, mn, n_fin, BLOCK, NP)
    tl.store(out_ptr + i, thr)


def top_k_top_p_threshold_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    log_min_p: torch.Tensor, block: int = 512, num_pivots: int = 16,
) -> torch.Tensor:
    """Same contract as ``top_k_top_p_threshold_ref``: [n, V] -> [n] float32 thresholds."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(n, dtype=torch.float32, device=logits.device)
    if n:
        _threshold_kernel[(n,)](
            logits, logits.stride(0), inv_temp.float().contiguous(), top_k.to(torch.int32).contiguous(),
            top_p.float().contiguous(), log_min_p.float().contiguous(), out, vocab,
            BLOCK=block, NP=num_pivots,
        )
    return out
