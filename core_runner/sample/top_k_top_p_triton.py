"""Sampling under top-k / top-p / min-p without sorting the vocabulary (Triton twin of
``top_k_top_p.top_k_top_p_threshold_ref`` followed by ``gumbel.gumbel_sample_ref``; the
definitions and the tie rule are documented in ``top_k_top_p.py``).

Three launches, each through ``kernel[grid](...)``; nothing of size batch x vocab:

1. read, grid (rows, S parts): each program streams its contiguous part in tiles of BLOCK
   columns (x = logit * inv_temp). Each row picks its mode on the device: greedy rows take
   the argmax, rows without a cut the Gumbel-Max draw (``gumbel_pass``), and rows with a cut
   gather statistics and no noise: the part's max, its mass sum(exp(x - max)), its number of
   finite tokens, and per lane (column mod BLOCK) the two largest values with their columns
   plus the lane's third largest value a3.
2. decide, one program per row: draw-mode rows combine their parts' tokens. Cut rows combine
   the parts' max m and mass Z and take G = the largest a3 of any lane. A token with x > G is
   among its lane's two largest (else its lane's third largest would be >= x > G), so the
   list entries above G are exactly the upper set {x > G}. Those candidates (at most CAP) are
   sorted and the threshold is read off them as the reference reads it off the sorted row:
   v_k, t_min = m + log(min_p), b = max(t_min, v_k), the mass of x >= b (Z when b = -inf,
   else the candidates' when b > G) and v_p. When the threshold lies above G the nucleus is
   inside the candidates, and the token is the argmax of x + noise over the candidates at or
   above it (the noise recomputed from the column, ties to the smallest column). Otherwise
   the row is flagged.
3. fallback, one program per row, returning at once unless flagged: the exact threshold by
   a pivot search over the row (``row_threshold``), then a masked Gumbel pass. Flat rows
   (e.g. N(0, 1) logits, whose nucleus holds ~90k tokens), top-k beyond the candidates and
   min-p below G end here: exact, but several reads of the row.

On peaked rows (the benchmark's N(0, 4^2) logits at temperature 0.7, top-p 0.9: a nucleus of
~36 tokens within ~6 of the max) the read is the only pass over the logits; the lists add
~S * BLOCK * 16 bytes a row of stores, so a call costs about 1.1-1.5 reads of the logits.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.sample.gumbel_triton import (
    _BIG,
    argmax_pass,
    col_hash,
    combine_part_tokens,
    gumbel_noise,
    gumbel_pass,
    row_keys,
    use_fast_log,
)

# tuning: programs per row in the read, columns per tile, candidates the decide sorts,
# pivots per pass of the fallback's search
_PARTS = 8
_BLOCK = 512
_CAP = 1024
_PIVOTS = 16
_LOG2E = tl.constexpr(1.4426950408889634)


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
def _has_cut(k, p, lmp, vocab):
    return ((k > 0) & (k < vocab)) | (p < 1.0) | (lmp > -float("inf"))


@triton.jit
def _read_kernel(logits_ptr, s_row, inv_t_ptr, k_ptr, p_ptr, lmp_ptr, seed_ptr, pos_ptr, tok_ptr, pmax_ptr, pmass_ptr,
                 pfin_ptr, pg_ptr, lv_ptr, lc_ptr, vocab, part, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    s = tl.program_id(1)
    o = i * tl.num_programs(1) + s
    row = logits_ptr + i.to(tl.int64) * s_row
    lo = s * part
    hi = tl.minimum(lo + part, vocab)
    inv_t = tl.load(inv_t_ptr + i)
    if inv_t == 0:
        tl.store(tok_ptr + o, argmax_pass(row, hi, BLOCK, lo))
    elif not _has_cut(tl.load(k_ptr + i), tl.load(p_ptr + i), tl.load(lmp_ptr + i), vocab):
        k1, k2 = row_keys(seed_ptr, pos_ptr, i)
        tl.store(tok_ptr + o, gumbel_pass(row, hi, inv_t, 0.0, k1, k2, False, FAST_LOG, BLOCK, lo))
    else:
        lanes = tl.arange(0, BLOCK)
        a1 = tl.full([BLOCK], -float("inf"), tl.float32)
        a2 = a1
        a3 = a1
        c1 = lo + lanes
        c2 = c1
        z = tl.zeros([BLOCK], tl.float32)  # the lane's mass relative to its max a1
        nf = tl.zeros([BLOCK], tl.int32)
        for start in range(lo, hi, BLOCK):
            cols = start + lanes
            x = tl.load(row + cols, mask=cols < hi, other=-float("inf")).to(tl.float32) * inv_t
            nf += (x > -float("inf")).to(tl.int32)
            gt1 = x > a1
            gt2 = x > a2
            a3 = tl.where(gt2, a2, tl.where(x > a3, x, a3))
            a2 = tl.where(gt1, a1, tl.where(gt2, x, a2))
            c2 = tl.where(gt1, c1, tl.where(gt2, cols, c2))
            new1 = tl.where(gt1, x, a1)
            ref = tl.where(new1 > -float("inf"), new1, 0.0)
            z = z * tl.math.exp2((a1 - ref) * _LOG2E) + tl.math.exp2((x - ref) * _LOG2E)
            a1 = new1
            c1 = tl.where(gt1, cols, c1)
        m = tl.max(a1, axis=0)
        ms = tl.where(m > -float("inf"), m, 0.0)
        tl.store(pmax_ptr + o, m)
        tl.store(pmass_ptr + o, tl.sum(z * tl.math.exp2((a1 - ms) * _LOG2E), axis=0))
        tl.store(pfin_ptr + o, tl.sum(nf, axis=0))
        tl.store(pg_ptr + o, tl.max(a3, axis=0))
        base = o.to(tl.int64) * 2 * BLOCK + lanes
        tl.store(lv_ptr + base, a1)
        tl.store(lv_ptr + base + BLOCK, a2)
        tl.store(lc_ptr + base, c1)
        tl.store(lc_ptr + base + BLOCK, c2)


@triton.jit
def _decide_kernel(logits_ptr, s_row, inv_t_ptr, k_ptr, p_ptr, lmp_ptr, seed_ptr, pos_ptr, tok_ptr, pmax_ptr,
                   pmass_ptr, pfin_ptr, pg_ptr, lv_ptr, lc_ptr, cv_ptr, cc_ptr, out_ptr, flag_ptr, vocab, n_parts,
                   FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, P: tl.constexpr, CAP: tl.constexpr):
    i = tl.program_id(0)
    row = logits_ptr + i.to(tl.int64) * s_row
    inv_t = tl.load(inv_t_ptr + i)
    k = tl.load(k_ptr + i)
    p = tl.load(p_ptr + i)
    lmp = tl.load(lmp_ptr + i)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    flag = 0
    if (inv_t == 0) | (not _has_cut(k, p, lmp, vocab)):
        tok = combine_part_tokens(row, tok_ptr + i * n_parts, n_parts, inv_t, 0.0, k1, k2, False, FAST_LOG, P)
    else:
        offs = tl.arange(0, P)
        ok = offs < n_parts
        pm = tl.load(pmax_ptr + i * n_parts + offs, mask=ok, other=-float("inf"))
        m = tl.max(pm, axis=0)
        ms = tl.where(m > -float("inf"), m, 0.0)
        z = tl.sum(tl.load(pmass_ptr + i * n_parts + offs, mask=ok, other=0.0) * tl.exp(pm - ms), axis=0)
        nf = tl.sum(tl.load(pfin_ptr + i * n_parts + offs, mask=ok, other=0), axis=0)
        g = tl.max(tl.load(pg_ptr + i * n_parts + offs, mask=ok, other=-float("inf")), axis=0)
        # the candidates {x > G}, moved part by part to the row's CAP slots of scratch
        e = tl.arange(0, 2 * BLOCK)
        n_c = 0
        for s in range(0, n_parts):
            lbase = (i.to(tl.int64) * n_parts + s) * 2 * BLOCK
            v = tl.load(lv_ptr + lbase + e)
            sel = v > g
            at = n_c + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            put = sel & (at < CAP)
            tl.store(cv_ptr + i * CAP + at, v, mask=put)
            tl.store(cc_ptr + i * CAP + at, tl.load(lc_ptr + lbase + e, mask=put, other=0), mask=put)
            n_c += tl.sum(sel.to(tl.int32), axis=0)
        tl.debug_barrier()  # stored by other threads
        j = tl.arange(0, CAP)
        valid = j < n_c
        cv = tl.load(cv_ptr + i * CAP + j, mask=valid, other=-float("inf"))
        cc = tl.load(cc_ptr + i * CAP + j, mask=valid, other=0)
        srt = tl.sort(cv, dim=0, descending=True)
        ok_row = (n_c <= CAP) & (nf > 0)
        # the reference's threshold, read off the sorted candidates
        b = m + lmp
        k_on = (k > 0) & (k < nf)
        if k_on:
            ok_row = ok_row & (k <= n_c)
            b = tl.maximum(b, tl.max(tl.where(j == k - 1, srt, -float("inf")), axis=0))
        thr = b
        if p < 1.0:
            ex = tl.where(valid & (srt >= b), tl.exp(srt - ms), 0.0)
            z_b = tl.where(b > -float("inf"), tl.sum(ex, axis=0), z)
            ok_row = ok_row & ((b == -float("inf")) | (b > g))
            cum = tl.cumsum(ex, axis=0)
            first = tl.sum((valid & (srt >= b) & (cum < p * z_b)).to(tl.int32), axis=0)
            n_b = tl.sum((valid & (srt >= b)).to(tl.int32), axis=0)
            ok_row = ok_row & (first < n_b)
            thr = tl.maximum(b, tl.max(tl.where(j == first, srt, -float("inf")), axis=0))
        if ok_row & (thr > g):
            noisy = tl.where(valid & (cv >= thr), cv + gumbel_noise(col_hash(cc), k1, k2, FAST_LOG), -float("inf"))
            top = tl.max(noisy, axis=0)
            tok = tl.min(tl.where(valid & (noisy == top), cc, _BIG), axis=0).to(tl.int64)
        else:
            flag = 1
            tok = tl.zeros([], tl.int64)
    tl.store(out_ptr + i, tok)
    tl.store(flag_ptr + i, flag)


@triton.jit
def _fallback_kernel(logits_ptr, s_row, inv_t_ptr, k_ptr, p_ptr, lmp_ptr, seed_ptr, pos_ptr, flag_ptr, cx_ptr,
                     out_ptr, thr_ptr, vocab, FAST_LOG: tl.constexpr, DRAW: tl.constexpr, BLOCK: tl.constexpr,
                     NP: tl.constexpr, CAP: tl.constexpr):
    """Flagged rows: the exact threshold, then a Gumbel pass over x >= threshold."""
    i = tl.program_id(0)
    if tl.load(flag_ptr + i) != 0:
        row = logits_ptr + i.to(tl.int64) * s_row
        inv_t = tl.load(inv_t_ptr + i)
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
                thr = row_threshold(row, vocab, inv_t, tl.load(k_ptr + i), tl.load(p_ptr + i), tl.load(lmp_ptr + i),
                                    tl.max(m, axis=0), mn_r, n_fin, mn_r, -float("inf"),
                                    cx_ptr + i.to(tl.int64) * CAP, BLOCK, NP, CAP)
        tl.store(thr_ptr + i, thr)
        if DRAW:
            k1, k2 = row_keys(seed_ptr, pos_ptr, i)
            tl.store(out_ptr + i, gumbel_pass(row, vocab, inv_t, thr, k1, k2, True, FAST_LOG, BLOCK, 0).to(tl.int64))


def _settings(logits, inv_temp, top_k, top_p, log_min_p):
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    return (logits, logits.stride(0), inv_temp.float().contiguous(), top_k.to(torch.int32).contiguous(),
            top_p.float().contiguous(), log_min_p.float().contiguous())


def cut_sample_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    top_k: torch.Tensor, top_p: torch.Tensor, log_min_p: torch.Tensor, *, block: int = _BLOCK,
    parts: int = _PARTS, cap: int = _CAP, with_flags: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[n, V] logits -> [n] int64 tokens, exactly those of the reference (up to float rounding
    of sums); any mix of greedy rows, rows without a cut and rows with one. ``with_flags``
    also returns which rows took the fallback ([n] int32)."""
    n, vocab = logits.shape
    dev = logits.device
    out = torch.empty(n, dtype=torch.int64, device=dev)
    flag = torch.empty(n, dtype=torch.int32, device=dev)
    if n:
        args = _settings(logits, inv_temp, top_k, top_p, log_min_p) + (seeds.contiguous(), positions.contiguous())
        part = triton.cdiv(triton.cdiv(vocab, parts), block) * block
        s = triton.cdiv(vocab, part)
        f32, i32 = torch.float32, torch.int32
        tok = torch.empty((n, s), dtype=i32, device=dev)
        pmax, pmass, pg = (torch.empty((n, s), dtype=f32, device=dev) for _ in range(3))
        pfin = torch.empty((n, s), dtype=i32, device=dev)
        lv = torch.empty((n, s * 2 * block), dtype=f32, device=dev)
        lc = torch.empty((n, s * 2 * block), dtype=i32, device=dev)
        cv = torch.empty((n, cap), dtype=f32, device=dev)
        cc = torch.empty((n, cap), dtype=i32, device=dev)
        fast = use_fast_log(dev)
        stats = (tok, pmax, pmass, pfin, pg, lv, lc)
        _read_kernel[(n, s)](*args, *stats, vocab, part, FAST_LOG=fast, BLOCK=block)
        _decide_kernel[(n,)](*args, *stats, cv, cc, out, flag, vocab, s, FAST_LOG=fast, BLOCK=block,
                             P=triton.next_power_of_2(s), CAP=cap)
        thr = torch.empty(n, dtype=f32, device=dev)
        _fallback_kernel[(n,)](*args, flag, cv, out, thr, vocab, FAST_LOG=fast, DRAW=True, BLOCK=block,
                               NP=_PIVOTS, CAP=cap)
    return (out, flag) if with_flags else out


def top_k_top_p_threshold_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
    log_min_p: torch.Tensor, block: int = _BLOCK, cap: int = _CAP,
) -> torch.Tensor:
    """Same contract as ``top_k_top_p_threshold_ref``: [n, V] -> [n] float32 thresholds
    (the fallback's search on every row; for tests)."""
    n, vocab = logits.shape
    dev = logits.device
    thr = torch.empty(n, dtype=torch.float32, device=dev)
    if n:
        args = _settings(logits, inv_temp, top_k, top_p, log_min_p)
        flag = torch.ones(n, dtype=torch.int32, device=dev)
        cx = torch.empty((n, cap), dtype=torch.float32, device=dev)
        _fallback_kernel[(n,)](*args, flag, flag, flag, cx, thr, thr, vocab, FAST_LOG=False, DRAW=False,
                               BLOCK=block, NP=_PIVOTS, CAP=cap)
    return thr
