"""The cut sampler's exact threshold search and the state a flagged row carries between
launches (``top_k_top_p_triton.py``'s module docstring is the design): order-preserving keys
of float values, pivot brackets narrowed by count (top-k) or mass (top-p), the serial per-row
search (``row_threshold``), and how a row whose lower cut is known starts its next step."""
from __future__ import annotations

import triton
import triton.language as tl

_FLT_MAX = tl.constexpr(3.4028234663852886e38)

# a flagged row's step (state field _PH); _SERIAL marks rows the last resort settled
_DONE = tl.constexpr(0)
_STATS = tl.constexpr(1)
_K_PIVOT = tl.constexpr(2)
_K_COLLECT = tl.constexpr(3)
_P_PIVOT = tl.constexpr(4)
_P_COLLECT = tl.constexpr(5)
_DRAW = tl.constexpr(6)
_SERIAL = tl.constexpr(7)
# a flagged row's state: int fields (step, bracket keys kl / kh, count of x >= value(kh), the
# decide's candidate count) and float fields (row max m, lower cut b, row mass Z relative to m,
# mass of x >= value(kh))
_NSI = tl.constexpr(8)
_PH = tl.constexpr(0)
_KL = tl.constexpr(1)
_KH = tl.constexpr(2)
_CHI = tl.constexpr(3)
_NC = tl.constexpr(4)
_NSF = tl.constexpr(8)
_M = tl.constexpr(0)
_B = tl.constexpr(1)
_Z = tl.constexpr(2)
_FHI = tl.constexpr(3)


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
def _pivots(kl, kh, NP: tl.constexpr):
    """NP increasing keys in (kl, kh]: spread evenly over the values, consecutive keys once the
    bracket is that narrow."""
    j = tl.arange(0, NP) + 1
    dense = kh - kl <= NP + 1
    lo_f = _value(kl)
    hi_f = _value(kh)
    spread = _key(lo_f + (hi_f - lo_f) * (j.to(tl.float32) / (NP + 1)))
    spread = tl.minimum(tl.maximum(spread, kl + j), kh - (NP + 1 - j))
    return tl.where(dense, tl.minimum(kl + j, kh), spread)


@triton.jit
def _narrow(pk, cnt, mass, c_lo, kl, kh, c_hi, f_hi, k_min, target, USE_MASS: tl.constexpr):
    """One search round: cnt / mass = count / mass of x >= value(pk) for each pivot, c_lo = count
    of x >= value(kl). The condition (count >= k_min; with USE_MASS mass >= target) holds on a
    prefix of the pivots (both fall as the pivot rises). Returns the new kl, kh, count and mass
    of x >= value(kh), and the count of the bracket [kl, kh)."""
    ok = cnt >= k_min
    if USE_MASS:
        ok = ok & (mass >= target)
    c_kl = tl.min(tl.where(ok, cnt, c_lo), axis=0)
    c_hi = tl.max(tl.where(ok, c_hi, cnt), axis=0)
    f_hi = tl.max(tl.where(ok, f_hi, mass), axis=0)
    new_kl = tl.max(tl.where(ok, pk, kl), axis=0)
    kh = tl.min(tl.where(ok, kh, pk), axis=0)
    return new_kl, kh, c_hi, f_hi, c_kl - c_hi


@triton.jit
def _bracket_value(vals, kl, kh, c_hi, f_hi, m, k_min, target, USE_MASS: tl.constexpr):
    """The search's answer from every token of its bracket [kl, kh) (``vals``, any order, -inf
    padded), c_hi / f_hi the count / mass of x >= value(kh): halvings of the keys keep the
    condition (count of x >= v reaches k_min; with USE_MASS mass reaches target) true at kl and
    false at kh, so kl ends on the largest key where it holds, a token's value (the condition
    only changes at tokens): the value of the first token, in descending order, to reach it."""
    e = tl.exp(vals - m)
    for _ in range(32):
        if kh - kl > 1:
            mid = kl + (kh - kl) // 2
            ge = vals >= _value(mid)
            if USE_MASS:
                holds = f_hi + tl.sum(tl.where(ge, e, 0.0), axis=0) >= target
            else:
                holds = c_hi + tl.sum(ge.to(tl.int32), axis=0) >= k_min
            kl = tl.where(holds, mid, kl)
            kh = tl.where(holds, kh, mid)
    return _value(kl)


@triton.jit
def _search(row, vocab, inv_t, m, lo, z_lo, kh, k_min, p, cx_ptr, USE_MASS: tl.constexpr, BLOCK: tl.constexpr,
            NP: tl.constexpr, CAP: tl.constexpr):
    """Largest v >= lo with count(x >= v) >= k_min (and, with USE_MASS, mass(x >= v) >=
    p * mass(x >= z_lo), z_lo <= lo); the condition holds at lo and fails at key kh. One
    program: a pass over the row a round (the split fallback spreads the same rounds)."""
    kl = _key(lo)
    n_in = CAP + 1  # tokens with key in [kl, kh) (unknown before the first pass)
    c_hi = 0  # count and mass of the tokens >= value(kh)
    f_hi = 0.0
    z = 0.0
    while (kh - kl > 1) & (n_in > CAP):
        pk = _pivots(kl, kh, NP)
        pv = _value(pk)
        lo_f = _value(kl)
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
        if USE_MASS:
            z = tl.sum(zz, axis=0)
        kl, kh, c_hi, f_hi, n_in = _narrow(pk, tl.sum(cnt, axis=0), tl.sum(mass, axis=0), tl.sum(c_lo, axis=0),
                                           kl, kh, c_hi, f_hi, k_min, p * z, USE_MASS)
    v = _value(kl)
    if kh - kl > 1:
        # the n_in <= CAP tokens of the bracket, collected: the answer is one of them
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
        vals = tl.load(cx_ptr + offs, mask=offs < n_st, other=-float("inf"), cache_modifier=".cg")
        v = _bracket_value(vals, kl, kh, c_hi, f_hi, m, k_min, p * z, USE_MASS)
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
def _p_floor(m, b, p, z_lb, vocab):
    """A value where the top-p condition holds: the tokens below m + log((1 - p) z_lb / (e V))
    hold less than (1 - p) / e of the mass of x >= b (z_lb <= that mass: the row's mass Z when
    b = -inf, else 1, the max's). When 1 - p is too small for this margin to beat rounding,
    m - 128 (exp underflows to 0 below)."""
    d = tl.where(p < 0.9999, tl.log((1.0 - p) * z_lb / vocab) - 1.0, -128.0)
    return tl.maximum(b, m + tl.maximum(d, -128.0))


@triton.jit
def _start_after_k(si, sf, fill_ptr, p, m, b, n_b, vocab, CAP: tl.constexpr):
    """State of a row whose b = max(t_min, v_k) is known: the draw, or the top-p search; that
    search collects at once when n_b >= count(x >= b) fits the slots."""
    tl.store(sf + _B, b)
    if p < 1.0:
        tl.store(si + _KH, (_key(m) + 1).to(tl.int32))
        tl.store(si + _CHI, 0)
        tl.store(sf + _FHI, 0.0)
        if n_b <= CAP:
            tl.store(si + _KL, _key(b).to(tl.int32))
            tl.store(fill_ptr, 0)
            tl.store(si + _PH, _P_COLLECT)
        else:
            z_lb = tl.where(b == -float("inf"), tl.load(sf + _Z), 1.0)
            tl.store(si + _KL, _key(_p_floor(m, b, p, z_lb, vocab)).to(tl.int32))
            tl.store(si + _PH, _P_PIVOT)
    else:
        tl.store(si + _PH, _DRAW)
