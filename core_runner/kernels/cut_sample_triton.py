"""Gumbel-Max sampling under min-p / top-k / top-p cuts, usually in two reads of the
logits, without finding the threshold first.

Definitions (``top_k_top_p.py``): x = logit * (1 / T); the cuts keep S = {x >= thr},
thr = max(b, v_p) with b = max(t_min, v_k), t_min = max(x) + log(min_p), v_k = the k-th
largest x, v_p = the largest value v with mass{x' >= v, x' >= b} >= p * mass{x' >= b}
(mass = sum of exp(x' - max)). The reference samples argmax over S of x + g (g: the
Gumbel noise of ``rng``; ties: first index).

One program per row.

Read 1 (``gumbel_pass``): the *unrestricted* draw t = argmax over all tokens of x + g,
plus the row max m, the number of finite tokens, and (rows with top-k and top-p) the
two largest x of every lane (column mod BLOCK). If t is in S, the restricted draw is t: t holds the
largest noisy value overall, so it does within S, and no earlier index of S can tie
with it (it would have tied in the whole row first). So only "x_t >= thr" is tested,
and that needs no threshold:
- min-p: x_t >= t_min (the same float sum m + log(min_p) as the reference). With min-p
  alone t_min is the threshold: a draw under it is redrawn by one masked read.
- top-k (0 < k < finite tokens): x_t >= v_k  <=>  c = count{x > x_t} < k (the k-th
  largest is <= x_t iff fewer than k tokens lie strictly above x_t).
- top-p, given x_t >= b: x_t >= v_p  <=>  A = mass{x > x_t} < p * Z_B, Z_B = mass{x >= b}.
  (The reference's v_p is the value at the first sorted rank whose cumulative mass
  reaches p * Z_B; the tokens with x > x_t fill the ranks before x_t's value, so
  v_p <= x_t iff their mass A stays below the target. Ties with x_t share its value
  and are kept with it; tokens above x_t are all in B when x_t >= b.)
  Z_B needs b: with top-k off, b = t_min is known after read 1. With top-k on, the k-th
  largest of the lanes' top-two lists, L, is a lower bound of v_k (k of those tokens are
  >= L), equal to it unless a lane holds three of the k largest; read 2 checks equality
  exactly (count{x > L} < k  <=>  L = v_k) and then Z_B = mass{x >= max(t_min, L)}.
A draw on the row maximum (x_t = m; often half the rows) is inside every cut (c = 0,
A = 0, m >= t_min) and needs nothing more. Otherwise read 2 (``_above``, rows with top-k
or top-p) sums c, A, Z_B and, when L is used,
count{x > L} and the size of C = {x > x_t} U {x >= L} (else L = +inf, C = {x > x_t}) in
per-lane accumulators.

Draw not kept (about 1 - top_p of the rows), read 3 (``_store_candidates``): C is stored
(values and indices, at most CAP) in a scratch row. C is an upper set of the row (every
token >= a member is a member), so it holds all of S when t is out (thr > x_t), and the
k largest tokens whenever it has k members. ``_finish`` sorts them (a CAP-wide
``tl.sort``) and computes the threshold from the sorted values as the reference does on
the whole row (v_k = k-th value, b, cumulative mass against p * Z_B, with Z_B the read-2
sum, or the candidates' own sum when top-k is on: then {x >= b} lies inside C), and the
draw is the argmax of x + g over the candidates >= thr (noise recomputed from their
indices; ties: smallest index). If thr <= x_t after all (the read-2 test and the sorted
sum can differ by rounding) the answer is t.

Fallback, when C has more than CAP tokens or cannot hold what the threshold needs (top-k
with k > 2 * BLOCK and top-p, draw inside the top-k but over the top-p cut): the exact
pivot search ``top_k_top_p_triton.row_threshold`` (started at L for top-k and at x_t for
top-p when read 2 proved v_p >= x_t) and one masked Gumbel read.

Everything is decided on the device (no host reads, grid = rows): rows that need less
work return earlier. Sums are float32 in another order than the reference's, as in the
threshold kernel: a top-p decision can differ from the reference only when the mass
above a value equals p * Z_B to within rounding (~1e-6 relative). Counts, maxima, t_min
and the comparisons on x are exact.

Top-p alone (no top-k, no min-p; ``_top_p_row``), the common case, takes a shorter
route. Read 1 also returns Z = mass of the row (B is the whole row) and the max of every
tile. A draw below the row max then needs A = mass{x > x_t}, and only tiles whose max
is above x_t hold such tokens: read 2 visits those, in decreasing order of their max
(``_above_tiles``), storing C. It stops early once A >= p * Z (out) and the stored
tokens above N, the largest max of the tiles not visited, hold >= p * Z: they are all
the row's tokens above N, so v_p > N and the stored tokens hold S. Before read 2 a
floor F <= v_p is read off the lanes' maxima (BLOCK distinct tokens; the r largest
have mass{x >= L_r} >= their own mass; F = the first L_r reaching p * Z): a draw under
F is out at once and only the tokens >= F are visited and stored, so a far draw does not
fill the candidate row with tokens that cannot be in S.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from core_runner.kernels.gumbel_sample import (
    argmax_pass, col_hash, first_argmax, gumbel_noise, gumbel_pass, row_keys, use_fast_log,
)
from core_runner.kernels.top_k_top_p_triton import _key, _value, row_threshold


@triton.jit
def _kth_largest(a1, a2, k):
    """Exact k-th largest value (1 <= k <= size of a1 + a2) of a1 and a2 together: 32
    halvings of an interval of float order keys."""
    ka = _key(a1)
    kb = _key(a2)
    lo = tl.full([], -(2**31), tl.int64)  # count(key >= lo) >= k
    hi = tl.full([], 2**31, tl.int64)  # count(key >= hi) < k
    for _ in range(32):
        mid = (lo + hi) >> 1
        c = tl.sum((ka >= mid).to(tl.int32) + (kb >= mid).to(tl.int32), axis=0)
        ok = c >= k
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return _value(lo)


@triton.jit
def _above(row, vocab, inv_t, m, x_t, b2, big_l, TOPK: tl.constexpr, BLOCK: tl.constexpr, NS: tl.constexpr):
    """Read 2: count{x > x_t}, mass{x > x_t}, mass{x >= b2} and, with TOPK, count{x > L}
    and the size of C (without: C = {x > x_t})."""
    lanes = tl.arange(0, BLOCK)
    c_gt = tl.zeros([BLOCK], dtype=tl.int32)
    c_gt_l = tl.zeros([BLOCK], dtype=tl.int32)
    n_c = tl.zeros([BLOCK], dtype=tl.int32)
    a_gt = tl.zeros([BLOCK], dtype=tl.float32)
    zb = tl.zeros([BLOCK], dtype=tl.float32)
    nxt = tl.load(row + lanes, mask=lanes < vocab, other=-float("inf"))
    for start in tl.range(0, vocab, BLOCK, num_stages=NS):
        x = nxt.to(tl.float32) * inv_t
        cols = start + BLOCK + lanes  # the next tile's load is in flight during this one's sums
        nxt = tl.load(row + cols, mask=cols < vocab, other=-float("inf"))
        e = tl.exp(x - m)  # 0 for -inf tokens
        gt = x > x_t
        c_gt += gt.to(tl.int32)
        a_gt += tl.where(gt, e, 0.0)
        zb += tl.where(x >= b2, e, 0.0)
        if TOPK:
            c_gt_l += (x > big_l).to(tl.int32)
            n_c += (gt | (x >= big_l)).to(tl.int32)
    c = tl.sum(c_gt, axis=0)
    if TOPK:
        n = tl.sum(n_c, axis=0)
    else:
        n = c
    return c, tl.sum(a_gt, axis=0), tl.sum(zb, axis=0), tl.sum(c_gt_l, axis=0), n


@triton.jit
def _store_candidates(row, vocab, inv_t, x_t, big_l, cx_ptr, ci_ptr, BLOCK: tl.constexpr, CAP: tl.constexpr):
    """Read 3 (rows whose draw fell outside the cut): C = {x > x_t} U {x >= L} in column
    order into the scratch row (the caller checked that it fits)."""
    lanes = tl.arange(0, BLOCK)
    n_c = 0
    for start in range(0, vocab, BLOCK):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
        sel = ((x > x_t) | (x >= big_l)).to(tl.int32)
        n_sel = tl.sum(sel, axis=0)
        if n_sel > 0:
            at = n_c + tl.cumsum(sel, axis=0) - 1
            put = (sel > 0) & (at < CAP)  # (never false: the caller checked the count)
            tl.store(cx_ptr + at, x, mask=put, cache_modifier=".cg")
            tl.store(ci_ptr + at, cols, mask=put, cache_modifier=".cg")
        n_c += n_sel
    return n_c


@triton.jit
def _min_finite(row, vocab, inv_t, BLOCK: tl.constexpr, NS: tl.constexpr):
    """Smallest finite x (a read for the pivot search)."""
    lanes = tl.arange(0, BLOCK)
    mn = tl.full([BLOCK], float("inf"), tl.float32)
    for start in tl.range(0, vocab, BLOCK, num_stages=NS):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
        mn = tl.minimum(mn, tl.where(x > -float("inf"), x, float("inf")))
    return tl.min(mn, axis=0)


@triton.jit
def _finish(cx_ptr, ci_ptr, n_c, t, x_t, m, t_min, k, topk_on, p, zb, k1, k2,
            FAST_LOG: tl.constexpr, CAP: tl.constexpr):
    """The draw from the n_c <= CAP stored candidates (see the module docstring)."""
    offs = tl.arange(0, CAP)
    valid = offs < n_c
    cx = tl.load(cx_ptr + offs, mask=valid, other=-float("inf"), cache_modifier=".cg")
    ci = tl.load(ci_ptr + offs, mask=valid, other=0, cache_modifier=".cg")
    s = tl.sort(cx, dim=0, descending=True)
    vk = -float("inf")
    if topk_on:
        vk = tl.max(tl.where(offs == k - 1, s, -float("inf")), axis=0)
    b = tl.maximum(t_min, vk)
    thr = b
    if p < 1.0:
        w = tl.where(s >= b, tl.exp(s - m), 0.0)
        cum = tl.cumsum(w, axis=0)
        z = zb
        if topk_on:
            z = tl.max(cum, axis=0)  # {x >= b} lies inside the candidates
        first = tl.sum((cum < p * z).to(tl.int32), axis=0)  # -inf padding if none
        thr = tl.maximum(b, tl.max(tl.where(offs == first, s, -float("inf")), axis=0))
    tok = t
    if x_t < thr:
        g = gumbel_noise(col_hash(ci), k1, k2, FAST_LOG)
        noisy = tl.where(valid & (cx >= thr), cx + g, -float("inf"))
        tok = first_argmax(noisy, ci)
    return tok


@triton.jit
def _cut_row(row, vocab, inv_t, t, a1, a2, n_fin, k, p, lmp, k1, k2, cx_ptr, ci_ptr,
             FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr, SBLOCK: tl.constexpr,
             NP: tl.constexpr, NT: tl.constexpr, NSD: tl.constexpr, NS: tl.constexpr):
    """(token, path) of a row with a cut, given its unrestricted draw t and read-1 stats."""
    topk_on = (k > 0) & (k < n_fin)
    m = tl.max(a1, axis=0)
    x_t = tl.load(row + t).to(tl.float32) * inv_t
    t_min = m + lmp  # -inf when min-p is off: the same float sum as the reference
    path = 1
    if x_t >= m:
        pass  # the draw holds the row maximum: inside every cut (c = 0, A = 0, x_t >= t_min)
    elif (not topk_on) & (p >= 1.0):
        # min-p alone: the threshold t_min is known, no second read for a kept draw
        if x_t < t_min:
            path = 2
            t, _a1, _a2, _nf, _z, _tm = gumbel_pass(row, vocab, inv_t, t_min, k1, k2, True, False, False, False,
                                                    FAST_LOG, BLOCK, NT, NSD, 0)
    else:
        lk_ok = topk_on & (p < 1.0) & (k <= 2 * BLOCK)  # L is only needed for Z_B
        big_l = float("inf")  # L: a lower bound of v_k (+inf: none)
        if lk_ok:
            big_l = _kth_largest(a1, a2, k)
        b2 = t_min
        if topk_on:
            b2 = tl.maximum(t_min, big_l)
        if lk_ok:
            c, a_gt, z_b, c_gt_l, n_c = _above(row, vocab, inv_t, m, x_t, b2, big_l, True, BLOCK, NS)
        else:
            c, a_gt, z_b, c_gt_l, n_c = _above(row, vocab, inv_t, m, x_t, b2, big_l, False, BLOCK, NS)
        z_known = (not topk_on) | (lk_ok & (c_gt_l < k))  # then Z_B = z_b
        in_b = (x_t >= t_min) & ((not topk_on) | (c < k))  # x_t >= b
        if not (in_b & ((p >= 1.0) | (z_known & (a_gt < p * z_b)))):
            path = 2
            if (n_c <= CAP) & ((not topk_on) | (p >= 1.0) | (n_c >= k) | (x_t < t_min)):
                n_c = _store_candidates(row, vocab, inv_t, x_t, big_l, cx_ptr, ci_ptr, BLOCK, CAP)  # same n_c
                tl.debug_barrier()  # the candidates were stored by other threads
                t = _finish(cx_ptr, ci_ptr, n_c, t, x_t, m, t_min, k, topk_on, p, z_b, k1, k2, FAST_LOG, CAP)
            else:
                path = 3
                mn = _min_finite(row, vocab, inv_t, BLOCK, NS)
                lo_k = mn
                if lk_ok:
                    lo_k = big_l  # k tokens are >= L
                lo_p = -float("inf")
                if in_b & z_known & (a_gt >= p * z_b):
                    lo_p = x_t  # mass{x >= x_t} >= p * Z_B: v_p >= x_t
                thr = row_threshold(row, vocab, inv_t, k, p, lmp, m, mn, n_fin, lo_k, lo_p, cx_ptr, SBLOCK, NP, CAP)
                t, _a1, _a2, _nf, _z, _tm = gumbel_pass(row, vocab, inv_t, thr, k1, k2, True, False, False, False,
                                                        FAST_LOG, BLOCK, NT, NSD, 0)
    return t, path


@triton.jit
def _above_tiles(row, vocab, inv_t, m, x_t, target, tmax, cx_ptr, ci_ptr, BLOCK: tl.constexpr,
                 NT: tl.constexpr, CAP: tl.constexpr):
    """Read 2 of a top-p-only row, tile by tile in decreasing order of the tile maxima of
    read 1, over tiles whose max is above x_t only: stores C = {x > x_t} of the visited
    tiles (at most CAP) and sums their mass A. Stops when every such tile is visited (A
    is then mass{x > x_t}), or early once A >= target (the draw is out) and the stored
    tokens above the largest unvisited tile max N hold >= target: they are all of the
    row's tokens above N, so v_p > N and the stored tokens hold every token >= v_p.
    Returns (A, number of C tokens seen)."""
    lanes = tl.arange(0, BLOCK)
    tiles = tl.arange(0, NT)
    offs = tl.arange(0, CAP)
    a = tl.zeros([], tl.float32)
    n_c = tl.zeros([], tl.int32)
    covered = tl.zeros([], tl.int32)
    rem = tmax
    top = tl.max(rem, axis=0)
    ok = top > x_t  # the current tile is one to visit
    j = tl.argmax(rem, axis=0)
    rem = tl.where(tiles == j, -float("inf"), rem)
    cols = j * BLOCK + lanes
    x = tl.load(row + cols, mask=cols < tl.where(ok, vocab, 0), other=-float("inf"))
    for _ in range(NT):  # (a while loop here crashes triton 3.6's layout pass on sm90)
        if ok & (covered == 0):
            # the next tile to visit is known before this one is summed: its load is in flight
            nxt = tl.max(rem, axis=0)  # N: the largest max of the tiles not summed yet
            n_ok = nxt > x_t
            nj = tl.argmax(rem, axis=0)
            rem = tl.where(tiles == tl.where(n_ok, nj, -1), -float("inf"), rem)
            n_cols = nj * BLOCK + lanes
            x_next = tl.load(row + n_cols, mask=n_cols < tl.where(n_ok, vocab, 0), other=-float("inf"))
            x = x.to(tl.float32) * inv_t
            gt = x > x_t
            a += tl.sum(tl.where(gt, tl.exp(x - m), 0.0), axis=0)
            sel = gt.to(tl.int32)
            at = n_c + tl.cumsum(sel, axis=0) - 1
            put = gt & (at < CAP)
            tl.store(cx_ptr + at, x, mask=put, cache_modifier=".cg")
            tl.store(ci_ptr + at, cols, mask=put, cache_modifier=".cg")
            n_c += tl.sum(sel, axis=0)
            if (a >= target) & (n_c <= CAP):
                tl.debug_barrier()  # the candidates were stored by other threads
                cx = tl.load(cx_ptr + offs, mask=offs < n_c, other=-float("inf"), cache_modifier=".cg")
                if tl.sum(tl.where(cx > nxt, tl.exp(cx - m), 0.0), axis=0) >= target:
                    covered = 1
            ok = n_ok
            cols = n_cols
            x = x_next
    return a, n_c


@triton.jit
def lane_floor(a1, m, target, BLOCK: tl.constexpr):
    """F <= v_p from the lanes' maxima (BLOCK distinct tokens that hold the row's top
    tokens unless two share a lane): the r largest, L_1 >= .. >= L_r, give mass{x >= L_r}
    >= their mass, and F = the first L_r where that reaches the target (-inf: none)."""
    ls = tl.sort(a1, dim=0, descending=True)
    first = tl.sum((tl.cumsum(tl.exp(ls - m), axis=0) < target).to(tl.int32), axis=0)
    return tl.max(tl.where(tl.arange(0, BLOCK) == first, ls, -float("inf")), axis=0)


@triton.jit
def _top_p_row(row, vocab, inv_t, t, a1, n_fin, z, tmax, k, p, lmp, k1, k2, cx_ptr, ci_ptr,
               FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr, SBLOCK: tl.constexpr,
               NP: tl.constexpr, NT: tl.constexpr, NSD: tl.constexpr, NS: tl.constexpr):
    """(token, path) of a row with top-p and no other cut: Z_B = Z came with read 1, and
    read 2 touches only the tiles holding tokens above the draw (see the module docstring)."""
    m = tl.max(a1, axis=0)
    x_t = tl.load(row + t).to(tl.float32) * inv_t
    path = 1
    if x_t < m:
        floor = lane_floor(a1, m, p * z, BLOCK)
        if x_t < floor:  # out of the cut for sure: only the tokens >= F are needed
            below = _value(_key(floor) - 1)  # the float just under F: x > below <=> x >= F
            a_gt, n_c = _above_tiles(row, vocab, inv_t, m, below, p * z, tmax, cx_ptr, ci_ptr, BLOCK, NT, CAP)
            a_gt = tl.maximum(a_gt, p * z)  # (rejected whatever the sum)
        else:
            a_gt, n_c = _above_tiles(row, vocab, inv_t, m, x_t, p * z, tmax, cx_ptr, ci_ptr, BLOCK, NT, CAP)
        if not (a_gt < p * z):
            path = 2
            if n_c <= CAP:
                tl.debug_barrier()  # the candidates were stored by other threads
                t = _finish(cx_ptr, ci_ptr, n_c, t, x_t, m, -float("inf"), 0, False, p, z, k1, k2, FAST_LOG, CAP)
            else:
                path = 3
                mn = _min_finite(row, vocab, inv_t, BLOCK, NS)
                # A >= p * Z: mass{x >= x_t} reaches the target, so v_p >= x_t (and >= F)
                thr = row_threshold(row, vocab, inv_t, k, p, lmp, m, mn, n_fin, mn, tl.maximum(x_t, floor), cx_ptr,
                                    SBLOCK, NP, CAP)
                t, _a1, _a2, _nf, _z, _tm = gumbel_pass(row, vocab, inv_t, thr, k1, k2, True, False, False, False,
                                                        FAST_LOG, BLOCK, NT, NSD, 0)
    return t, path


@triton.jit
def _cut_sample_kernel(
    logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr,
    cand_x_ptr, cand_i_ptr, out_ptr, path_ptr, vocab,
    FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr, SBLOCK: tl.constexpr, NP: tl.constexpr,
    NT: tl.constexpr, NSD: tl.constexpr, NS: tl.constexpr,
):
    i = tl.program_id(0)
    row = logits_ptr + i.to(tl.int64) * s_row
    inv_t = tl.load(inv_t_ptr + i)
    path = 0  # 0 greedy or no cut, 1 draw kept, 2 redrawn without a search, 3 search
    if inv_t > 0:
        k1, k2 = row_keys(seed_ptr, pos_ptr, i)
        k = tl.load(top_k_ptr + i)
        p = tl.load(top_p_ptr + i)
        lmp = tl.load(lmp_ptr + i)
        cx_ptr = cand_x_ptr + i.to(tl.int64) * CAP
        ci_ptr = cand_i_ptr + i.to(tl.int64) * CAP
        if (k <= 0) & (p < 1.0) & (lmp == -float("inf")):  # top-p alone: Z and tile maxima from read 1
            t, a1, a2, n_fin, z, tmax = gumbel_pass(row, vocab, inv_t, 0.0, k1, k2, False, True, False, True,
                                                    FAST_LOG, BLOCK, NT, NSD, 0)
            if n_fin > 0:
                t, path = _top_p_row(row, vocab, inv_t, t, a1, n_fin, z, tmax, k, p, lmp, k1, k2, cx_ptr, ci_ptr,
                                     FAST_LOG, BLOCK, CAP, SBLOCK, NP, NT, NSD, NS)
        else:
            if (k > 0) & (p < 1.0):  # the lanes' second maxima are only needed for top-k + top-p
                t, a1, a2, n_fin, z, tmax = gumbel_pass(row, vocab, inv_t, 0.0, k1, k2, False, True, True, False,
                                                        FAST_LOG, BLOCK, NT, NSD, 0)
            else:
                t, a1, a2, n_fin, z, tmax = gumbel_pass(row, vocab, inv_t, 0.0, k1, k2, False, True, False, False,
                                                        FAST_LOG, BLOCK, NT, NSD, 0)
            if (n_fin > 0) & (((k > 0) & (k < n_fin)) | (p < 1.0) | (lmp > -float("inf"))):
                t, path = _cut_row(row, vocab, inv_t, t, a1, a2, n_fin, k, p, lmp, k1, k2, cx_ptr, ci_ptr,
                                   FAST_LOG, BLOCK, CAP, SBLOCK, NP, NT, NSD, NS)
        tok = t
    else:
        tok = argmax_pass(row, vocab, BLOCK, NSD, 0)
    tl.store(out_ptr + i, tok.to(tl.int64))
    tl.store(path_ptr + i, path)


def sample_with_cuts_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    top_k: torch.Tensor, top_p: torch.Tensor, log_min_p: torch.Tensor, out: torch.Tensor | None = None,
    block: int = 2048, cap: int = 1024, search_block: int = 64, num_pivots: int = 16, num_warps: int = 8,
    paths: torch.Tensor | None = None, draw_stages: int = 1, sum_stages: int = 1, split: int = 1,
    nucleus_first: bool = False, marks: list | None = None, lists: int = 0, list_slots: int = 256,
    tile_max: bool = True, all_top_p: bool = False, rounds: int = 2, round_maxnreg: int | None = None,
    decide_warps: int = 0, narrow_draw: bool = True, decide_width: int = 0,
) -> torch.Tensor:
    """[n, V] logits -> [n] int64 tokens: the token of ``gumbel_sample_ref`` under the
    threshold of ``top_k_top_p_threshold_ref`` (same inputs), without computing it.

    Scratch: [n, cap] float32 + int32 candidates (8 MiB at n = 1024, cap = 1024).
    ``paths`` ([n] int32, optional) receives how each row was decided: 0 greedy or no
    cut, 1 unrestricted draw kept, 2 redrawn without a search (candidates, or the min-p
    mask), 3 pivot search, 4 top-p alone after histogram rounds over many programs (split:
    ``rounds`` launches after read 2, ``split_rounds_triton``; ``round_maxnreg`` caps their
    registers; ``decide_warps`` > 0: the decide in a launch of its own with that many
    warps; ``narrow_draw`` False: the lists' draw on all their slots; ``decide_width``: the
    entries above T moved first and drawn on that many slots); 7 top-p alone
    drawn among the candidates >= F without a first draw (split with ``nucleus_first``),
    8 the same drawn from read 1's lane lists (``lists``),
    9 a row that breaks the ``all_top_p`` promise (token -1).
    ``split`` > 1 spreads every row over that many programs
    (``cut_sample_split_triton``: five launches, the same tokens); there
    ``nucleus_first`` draws a top-p-alone row only among its nucleus candidates (read 1
    without hashing; ``lists`` 2 or 3: with lane lists, ``lane_lists_triton``). ``marks``:
    per-launch CUDA events of the split kernels
    (``sample_with_cuts_split``)."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    if out is None:
        out = torch.empty(n, dtype=torch.int64, device=dev)
    if n:
        if paths is None:
            paths = torch.empty(n, dtype=torch.int32, device=dev)
        if split > 1:
            from core_runner.kernels.cut_sample_split_triton import sample_with_cuts_split

            return sample_with_cuts_split(logits, inv_temp, seeds, positions, top_k, top_p, log_min_p, out, paths,
                                          split, block, cap, search_block, num_pivots, num_warps, nucleus_first,
                                          marks, lists, list_slots, tile_max, all_top_p, rounds,
                                          round_maxnreg, decide_warps, narrow_draw, decide_width)
        if marks is not None:
            raise ValueError(f"marks (per-launch events) need split > 1 (one launch here); got split={split}")
        if nucleus_first or lists or all_top_p:
            raise ValueError(f"nucleus_first={nucleus_first}, lists={lists}, all_top_p={all_top_p} need split > 1 "
                             f"(the split kernels have them); got split={split}")
        cand_x = torch.empty((n, cap), dtype=torch.float32, device=dev)
        cand_i = torch.empty((n, cap), dtype=torch.int32, device=dev)
        _cut_sample_kernel[(n,)](
            logits, logits.stride(0), inv_temp.float().contiguous(), seeds.contiguous(), positions.contiguous(),
            top_k.to(torch.int32).contiguous(), top_p.float().contiguous(), log_min_p.float().contiguous(),
            cand_x, cand_i, out, paths, vocab,
            FAST_LOG=use_fast_log(dev), BLOCK=block, CAP=cap, SBLOCK=search_block, NP=num_pivots,
            NT=triton.next_power_of_2(triton.cdiv(vocab, block)), NSD=draw_stages, NS=sum_stages,
            num_warps=num_warps,
        )
    return out
