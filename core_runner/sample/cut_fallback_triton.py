"""The cut sampler's split fallback (``top_k_top_p_triton.py``'s module docstring is the
design): rounds over (flagged row, chunk) items that count pivots, collect bracket tokens or
draw, the last chunk of a row moving it to its next step, and the serial per-row search as
the last resort."""
from __future__ import annotations

import triton
import triton.language as tl

from core_runner.sample.cut_search_triton import (
    _B,
    _CHI,
    _DONE,
    _DRAW,
    _FHI,
    _K_COLLECT,
    _K_PIVOT,
    _KH,
    _KL,
    _M,
    _NC,
    _NSF,
    _NSI,
    _P_COLLECT,
    _P_PIVOT,
    _PH,
    _SERIAL,
    _STATS,
    _bracket_value,
    _key,
    _narrow,
    _pivots,
    _start_after_k,
    _value,
    row_threshold,
)
from core_runner.sample.gumbel_triton import (
    _BIG,
    col_hash,
    gumbel_noise,
    gumbel_pass,
    row_keys,
)


@triton.jit
def _pivot_pass(row, lo, hi, inv_t, m, b, lo_f, hi_f, pv, TILE: tl.constexpr, NP: tl.constexpr):
    """Over columns [lo, hi): count and mass of x >= each pivot (in [lo_f, hi_f]), count of
    x >= lo_f, mass of x >= b. Only tiles with tokens inside the bracket pay the compares."""
    lanes = tl.arange(0, TILE)
    cnt = tl.zeros([NP], tl.int32)
    mass = tl.zeros([NP], tl.float32)
    c_lo = 0
    f_z = 0.0
    for start in range(lo, hi, TILE):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < hi, other=-float("inf")).to(tl.float32) * inv_t
        e = tl.exp(x - m)
        ge_lo = x >= lo_f
        ab = x >= hi_f
        c_lo += tl.sum(ge_lo.to(tl.int32), axis=0)
        f_z += tl.sum(tl.where(x >= b, e, 0.0), axis=0)
        cnt += tl.sum(ab.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(ab, e, 0.0), axis=0)
        if tl.max((ge_lo & (x < hi_f)).to(tl.int32), axis=0) > 0:
            # the tile again (from cache), converted inside this block: triton 3.6's layout pass
            # fails on bf16 rows when values converted outside the branch are used in it
            xi = tl.load(row + cols, mask=cols < hi, other=-float("inf")).to(tl.float32) * inv_t
            ge = ((xi >= lo_f) & (xi < hi_f))[:, None] & (xi[:, None] >= pv[None, :])
            cnt += tl.sum(ge.to(tl.int32), axis=0)
            mass += tl.sum(tl.where(ge, tl.exp(xi - m)[:, None], 0.0), axis=0)
    return cnt, mass, c_lo, f_z


@triton.jit
def _collect_pass(row, lo, hi, inv_t, m, b, lo_f, hi_f, cv_ptr, cc_ptr, fill_ptr, CAP: tl.constexpr,
                  TILE: tl.constexpr):
    """Appends the tokens of [lo_f, hi_f) in columns [lo, hi) to the row's slots (an atomic slot
    count: any order, which the finisher's halvings ignore); returns the mass of x >= b."""
    lanes = tl.arange(0, TILE)
    f_z = 0.0
    for start in range(lo, hi, TILE):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < hi, other=-float("inf")).to(tl.float32) * inv_t
        f_z += tl.sum(tl.where(x >= b, tl.exp(x - m), 0.0), axis=0)
        sel = (x >= lo_f) & (x < hi_f)
        n_sel = tl.sum(sel.to(tl.int32), axis=0)
        if n_sel > 0:
            at = tl.atomic_add(fill_ptr, n_sel) + tl.cumsum(sel.to(tl.int32), axis=0) - 1
            put = sel & (at < CAP)
            tl.store(cv_ptr + at, x, mask=put)
            tl.store(cc_ptr + at, cols, mask=put)
    return f_z


@triton.jit
def _chunk_draws(row, qi, n_chunks, inv_t, lo_x, k1, k2, FAST_LOG: tl.constexpr, NCH: tl.constexpr,
                 W: tl.constexpr):
    """The chunks' tokens (field W - 1 of each chunk's ints) and their noisy values, -inf
    unless x >= lo_x (a chunk without such a token returns one below it)."""
    ch = tl.arange(0, NCH)
    okc = ch < n_chunks
    tk = tl.load(qi + ch * W + W - 1, mask=okc, other=0, cache_modifier=".cg")
    xk = tl.load(row + tk, mask=okc, other=-float("inf")).to(tl.float32) * inv_t
    keep = okc & (xk >= lo_x)
    return tl.where(keep, xk + gumbel_noise(col_hash(tk), k1, k2, FAST_LOG), -float("inf")), tk


@triton.jit
def _finish(i, j, ph, row, inv_t, k, p, seed_ptr, pos_ptr, si, sf, qi, qf, cv, cc, fill_ptr, out_ptr, thr_ptr, vocab,
            n_chunks, FAST_LOG: tl.constexpr, NP: tl.constexpr, CAP: tl.constexpr, NCH: tl.constexpr,
            W: tl.constexpr):
    """The last item of row i in this round: reduce its chunks (in chunk order) and step on."""
    ch = tl.arange(0, NCH)
    okc = ch < n_chunks
    m = tl.load(sf + _M)
    b = tl.load(sf + _B)
    kl = tl.load(si + _KL).to(tl.int64)
    kh = tl.load(si + _KH).to(tl.int64)
    c_hi = tl.load(si + _CHI)
    f_hi = tl.load(sf + _FHI)
    f_z = tl.sum(tl.load(qf + ch * W + NP, mask=okc, other=0.0, cache_modifier=".cg"), axis=0)
    if ph == _STATS:
        nf = tl.sum(tl.load(qi + ch * W + NP + 1, mask=okc, other=0, cache_modifier=".cg"), axis=0)
        mn = tl.min(tl.load(qf + ch * W + NP + 1, mask=okc, other=float("inf"), cache_modifier=".cg"), axis=0)
        if k < nf:
            tl.store(si + _KL, _key(mn).to(tl.int32))
            if nf - tl.load(si + _NC) <= CAP:  # the bracket [mn, G] holds every finite token <= G
                tl.store(fill_ptr, 0)
                tl.store(si + _PH, _K_COLLECT)
            else:
                tl.store(si + _PH, _K_PIVOT)
        else:
            _start_after_k(si, sf, fill_ptr, p, m, b, CAP + 1, vocab, CAP)  # top-k beyond the finite tokens
    elif (ph == _K_PIVOT) | (ph == _P_PIVOT):
        tile = ch[:, None] * W + tl.arange(0, NP)[None, :]
        cnt = tl.sum(tl.load(qi + tile, mask=okc[:, None], other=0, cache_modifier=".cg"), axis=0)
        mass = tl.sum(tl.load(qf + tile, mask=okc[:, None], other=0.0, cache_modifier=".cg"), axis=0)
        c_lo = tl.sum(tl.load(qi + ch * W + NP, mask=okc, other=0, cache_modifier=".cg"), axis=0)
        pk = _pivots(kl, kh, NP)
        if ph == _K_PIVOT:
            kl, kh, c_hi, f_hi, n_in = _narrow(pk, cnt, mass, c_lo, kl, kh, c_hi, f_hi, k, 0.0, False)
        else:
            kl, kh, c_hi, f_hi, n_in = _narrow(pk, cnt, mass, c_lo, kl, kh, c_hi, f_hi, 0, p * f_z, True)
        if kh - kl <= 1:  # one key left: the answer is its value
            if ph == _K_PIVOT:
                _start_after_k(si, sf, fill_ptr, p, m, tl.maximum(b, _value(kl)), CAP + 1, vocab, CAP)
            else:
                tl.store(sf + _B, _value(kl))
                tl.store(si + _PH, _DRAW)
        else:
            tl.store(si + _KL, kl.to(tl.int32))
            tl.store(si + _KH, kh.to(tl.int32))
            tl.store(si + _CHI, c_hi)
            tl.store(sf + _FHI, f_hi)
            if n_in <= CAP:
                tl.store(fill_ptr, 0)
                tl.store(si + _PH, ph + 1)  # the collect step of the same search
    elif (ph == _K_COLLECT) | (ph == _P_COLLECT):
        offs = tl.arange(0, CAP)
        n_st = tl.load(fill_ptr, cache_modifier=".cg")
        valid = offs < n_st
        vals = tl.load(cv + offs, mask=valid, other=-float("inf"), cache_modifier=".cg")
        if ph == _K_COLLECT:
            v = _bracket_value(vals, kl, kh, c_hi, f_hi, m, k, 0.0, False)
            n_v = c_hi + tl.sum((vals >= v).to(tl.int32), axis=0)  # count of x >= v_k >= that of x >= b
            _start_after_k(si, sf, fill_ptr, p, m, tl.maximum(b, v), n_v, vocab, CAP)
        else:
            thr = _bracket_value(vals, kl, kh, c_hi, f_hi, m, 0, p * f_z, True)
            # the draw: the bracket's tokens at or above the threshold, and the chunks' best
            # tokens above the bracket
            k1, k2 = row_keys(seed_ptr, pos_ptr, i)
            cols = tl.load(cc + offs, mask=valid, other=0, cache_modifier=".cg")
            keep = valid & (vals >= thr)
            nb = tl.where(keep, vals + gumbel_noise(col_hash(cols), k1, k2, FAST_LOG), -float("inf"))
            na, ta = _chunk_draws(row, qi, n_chunks, inv_t, _value(kh), k1, k2, FAST_LOG, NCH, W)
            top = tl.maximum(tl.max(na, axis=0), tl.max(nb, axis=0))
            tok = tl.minimum(tl.min(tl.where(na == top, ta, _BIG), axis=0),
                             tl.min(tl.where(keep & (nb == top), cols, _BIG), axis=0))
            tl.store(out_ptr + i, tok.to(tl.int64))
            tl.store(thr_ptr + i, thr)
            tl.store(si + _PH, _DONE)
    else:  # _DRAW
        k1, k2 = row_keys(seed_ptr, pos_ptr, i)
        na, ta = _chunk_draws(row, qi, n_chunks, inv_t, b, k1, k2, FAST_LOG, NCH, W)
        top = tl.max(na, axis=0)
        tl.store(out_ptr + i, tl.min(tl.where(okc & (na == top), ta, _BIG), axis=0).to(tl.int64))
        tl.store(thr_ptr + i, b)
        tl.store(si + _PH, _DONE)


@triton.jit
def _round_kernel(logits_ptr, s_row, inv_t_ptr, k_ptr, p_ptr, seed_ptr, pos_ptr, flist_ptr, nflag_ptr, si_ptr, sf_ptr,
                  qi_ptr, qf_ptr, cv_ptr, cc_ptr, fill_ptr, done_ptr, out_ptr, thr_ptr, vocab, n_chunks,
                  FAST_LOG: tl.constexpr, CHUNK: tl.constexpr, TILE: tl.constexpr, NP: tl.constexpr,
                  CAP: tl.constexpr, NCH: tl.constexpr):
    """One split-fallback round: the programs share the items (flagged row j, chunk) in turn."""
    W: tl.constexpr = NP + 3  # per chunk: NP pivot counts / masses, then count >= lo / mass >= b,
    # finite count / smallest finite value, token
    n_items = tl.load(nflag_ptr) * n_chunks
    for item in range(tl.program_id(0), n_items, tl.num_programs(0)):
        j = item // n_chunks
        ch = item % n_chunks
        i = tl.load(flist_ptr + j)
        si = si_ptr + i * _NSI
        sf = sf_ptr + i * _NSF
        ph = tl.load(si + _PH)
        if ph != _DONE:
            row = logits_ptr + i.to(tl.int64) * s_row
            inv_t = tl.load(inv_t_ptr + i)
            lo = ch * CHUNK
            hi = tl.minimum(lo + CHUNK, vocab)
            qi = qi_ptr + (j * n_chunks + ch).to(tl.int64) * W
            qf = qf_ptr + (j * n_chunks + ch).to(tl.int64) * W
            m = tl.load(sf + _M)
            b = tl.load(sf + _B)
            lo_f = _value(tl.load(si + _KL).to(tl.int64))
            hi_f = _value(tl.load(si + _KH).to(tl.int64))
            if ph == _STATS:
                nf = 0
                mn = float("inf")
                for start in range(lo, hi, TILE):
                    cols = start + tl.arange(0, TILE)
                    x = tl.load(row + cols, mask=cols < hi, other=-float("inf")).to(tl.float32) * inv_t
                    fin = x > -float("inf")
                    nf += tl.sum(fin.to(tl.int32), axis=0)
                    mn = tl.minimum(mn, tl.min(tl.where(fin, x, float("inf")), axis=0))
                tl.store(qi + NP + 1, nf)
                tl.store(qf + NP + 1, mn)
            elif (ph == _K_PIVOT) | (ph == _P_PIVOT):
                pv = _value(_pivots(tl.load(si + _KL).to(tl.int64), tl.load(si + _KH).to(tl.int64), NP))
                cnt, mass, c_lo, f_z = _pivot_pass(row, lo, hi, inv_t, m, b, lo_f, hi_f, pv, TILE, NP)
                tl.store(qi + tl.arange(0, NP), cnt)
                tl.store(qf + tl.arange(0, NP), mass)
                tl.store(qi + NP, c_lo)
                tl.store(qf + NP, f_z)
            elif (ph == _K_COLLECT) | (ph == _P_COLLECT):
                f_z = _collect_pass(row, lo, hi, inv_t, m, b, lo_f, hi_f, cv_ptr + i.to(tl.int64) * CAP,
                                    cc_ptr + i.to(tl.int64) * CAP, fill_ptr + i, CAP, TILE)
                tl.store(qf + NP, f_z)
                if ph == _P_COLLECT:  # the tokens above the bracket are all kept: draw among them
                    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
                    tl.store(qi + W - 1, gumbel_pass(row, hi, inv_t, hi_f, k1, k2, True, FAST_LOG, TILE, lo))
            else:  # _DRAW under the threshold b
                k1, k2 = row_keys(seed_ptr, pos_ptr, i)
                tl.store(qi + W - 1, gumbel_pass(row, hi, inv_t, b, k1, k2, True, FAST_LOG, TILE, lo))
            tl.debug_barrier()  # the chunk's results, stored by every thread, before the count
            if tl.atomic_add(done_ptr + i, 1) == n_chunks - 1:
                tl.store(done_ptr + i, 0)
                _finish(i, j, ph, row, inv_t, tl.load(k_ptr + i), tl.load(p_ptr + i), seed_ptr, pos_ptr, si, sf,
                        qi_ptr + (j * n_chunks).to(tl.int64) * W, qf_ptr + (j * n_chunks).to(tl.int64) * W,
                        cv_ptr + i.to(tl.int64) * CAP, cc_ptr + i.to(tl.int64) * CAP, fill_ptr + i, out_ptr,
                        thr_ptr, vocab, n_chunks, FAST_LOG, NP, CAP, NCH, W)


@triton.jit
def _fallback_kernel(logits_ptr, s_row, inv_t_ptr, k_ptr, p_ptr, lmp_ptr, seed_ptr, pos_ptr, si_ptr, cx_ptr,
                     out_ptr, thr_ptr, vocab, FAST_LOG: tl.constexpr, DRAW: tl.constexpr, BLOCK: tl.constexpr,
                     NP: tl.constexpr, CAP: tl.constexpr):
    """Rows still unsettled: the exact threshold in one program, then a Gumbel pass over x >= it."""
    i = tl.program_id(0)
    if tl.load(si_ptr + i * _NSI + _PH) != _DONE:
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
        tl.store(si_ptr + i * _NSI + _PH, _SERIAL)
        if DRAW:
            k1, k2 = row_keys(seed_ptr, pos_ptr, i)
            tl.store(out_ptr + i, gumbel_pass(row, vocab, inv_t, thr, k1, k2, True, FAST_LOG, BLOCK, 0).to(tl.int64))
