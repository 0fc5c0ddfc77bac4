"""The finish of the split cut sampler (``cut_sample_split_triton``, step 4) for one row
the decide left open: it runs at the end of read 2 (``split_read2_triton``), on the last
program of the row to finish its chunks, or on the row's first work item when the row
needs no read 2 (other cuts: the one-program path). Also the row states the decide
leaves for read 2 and the finish, and the merge of the parts' lane maxima.
"""
from __future__ import annotations

import triton
import triton.language as tl

from core_runner.kernels.cut_sample_triton import _cut_row, _min_finite
from core_runner.kernels.gumbel_sample import col_hash, first_argmax, gumbel_noise, gumbel_pass, row_keys
from core_runner.kernels.lane_lists_triton import nucleus_floor
from core_runner.kernels.split_rounds_triton import _GATHER, _SEARCH, draw_in_bracket, select_bracket, store_bracket
from core_runner.kernels.top_k_top_p_triton import row_threshold

# row states after the decide
_DONE = tl.constexpr(0)
_READ2 = tl.constexpr(1)  # top-p alone, draw below the max: read 2 and the finish
_ONE_PROGRAM = tl.constexpr(2)  # other cuts: the one-program path in the finish


@triton.jit
def _lane_maxima(a1_ptr, i, n_parts, BLOCK: tl.constexpr):
    """Row i's lane maxima over its parts (each part stored its own)."""
    at = a1_ptr + (i * n_parts).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    a1 = tl.load(at)
    for s in range(1, n_parts):
        a1 = tl.maximum(a1, tl.load(at + s * BLOCK))
    return a1


@triton.jit
def _finish_row(i, logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr, row_f_ptr,
                row_i_ptr, a1_ptr, nc_ptr, chunk_a_ptr, cx_ptr, ci_ptr, out_ptr, path_ptr, brk_ptr, hist_ptr,
                next_ptr, vocab, n_parts, n_chunks, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr,
                SBLOCK: tl.constexpr, NP: tl.constexpr, NCP: tl.constexpr, SCAND: tl.constexpr,
                SCAND2: tl.constexpr, NPV: tl.constexpr, MORE: tl.constexpr, OTHER: tl.constexpr):
    """Step 4 for row i (state ``_READ2`` or ``_ONE_PROGRAM``). ``_READ2``: A = mass{x > lo}
    (read 2's chunk sums, in chunk order) >= p Z, or mode 2, means the candidates hold the
    nucleus: the draw among them (the narrowest sort that holds them), or past the
    capacity the rounds or the exact pivot search; A < p Z keeps the draw. ``_ONE_PROGRAM``: the rows
    with top-k or min-p on one program (``_cut_row``) with the merged lane maxima (their
    second maxima are not kept, which only loosens the top-k lower bound; the same
    result). MORE: histogram rounds follow, and a row whose candidates fall short of its
    nucleus goes on to them (``next_round``) instead of the one-program pivot search.
    OTHER: rows with other cuts may be in the batch (False with ``all_top_p``).
    Stores the token and path of a settled row; puts the row's candidate counter back to 0."""
    row = logits_ptr + i.to(tl.int64) * s_row
    state = tl.load(row_i_ptr + i * 4)
    path = tl.load(row_i_ptr + i * 4 + 2)
    t = tl.load(out_ptr + i).to(tl.int32)  # the draw paths produce int32 tokens
    inv_t = tl.load(inv_t_ptr + i)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    k = tl.load(top_k_ptr + i)
    p = tl.load(top_p_ptr + i)
    lmp = tl.load(lmp_ptr + i)
    n_fin = tl.load(row_i_ptr + i * 4 + 1)
    cx = cx_ptr + i.to(tl.int64) * CAP
    ci = ci_ptr + i.to(tl.int64) * CAP
    if state == _READ2:
        m = tl.load(row_f_ptr + i * 4)
        z = tl.load(row_f_ptr + i * 4 + 1)
        lo_v = tl.load(row_f_ptr + i * 4 + 2)
        x_t = tl.load(row_f_ptr + i * 4 + 3)
        offs = tl.arange(0, NCP)
        a_gt = tl.sum(tl.load(chunk_a_ptr + i * n_chunks + offs, mask=offs < n_chunks, other=0.0), axis=0)
        covered = (tl.load(row_i_ptr + i * 4 + 3) == 2) | (a_gt >= p * z)  # the candidates hold S
        if covered | (path == 7):  # (7, nucleus first: no draw to keep)
            if path != 7:
                path = 2
            n_c = tl.load(nc_ptr + i)
            if covered & (n_c <= SCAND):  # the usual few candidates: narrow arrays
                t = _finish_nucleus(cx, ci, n_c, t, x_t, m, p * z, lo_v, k1, k2, FAST_LOG, SCAND)
            elif covered & (n_c <= SCAND2):
                t = _finish_nucleus(cx, ci, n_c, t, x_t, m, p * z, lo_v, k1, k2, FAST_LOG, SCAND2)
            elif MORE:  # flat: the histogram rounds, from the decide's bracket
                if tl.load(brk_ptr + i * (NPV + 4) + 3) != 0:  # read 2 took its histogram
                    state = next_round(i, brk_ptr, hist_ptr, row_i_ptr, next_ptr, n_chunks, p * z, CAP, NPV, NCP)
                else:
                    state = _go_on(i, _SEARCH, row_i_ptr, next_ptr)
            # (MORE is a constexpr: with rounds to follow the two branches below are not compiled, and their
            # CAP-wide arrays do not raise the whole kernel's registers)
            elif covered & (n_c <= CAP):  # (CAP-wide arrays: slower, the rounds avoid them)
                t = _finish_nucleus(cx, ci, n_c, t, x_t, m, p * z, lo_v, k1, k2, FAST_LOG, CAP)
            else:
                path = 3
                # covered: v_p >= x_t = lo_v (mode 1, A >= p Z) or v_p >= F > lo_v (mode 2); else no hint
                t = _pivot_search(row, vocab, inv_t, k, p, lmp, m, n_fin, tl.where(covered, lo_v, -float("inf")),
                                  k1, k2, cx, FAST_LOG, BLOCK, SBLOCK, NP, CAP)
    elif OTHER:  # (a constexpr: a batch of top-p-alone rows has no row in this state, nor this path's code)
        a1 = _lane_maxima(a1_ptr, i, n_parts, BLOCK)
        a2 = tl.full([BLOCK], -float("inf"), tl.float32)
        t, path = _cut_row(row, vocab, inv_t, t, a1, a2, n_fin, k, p, lmp, k1, k2, cx, ci,
                           FAST_LOG, BLOCK, CAP, SBLOCK, NP, 1, 1, 1)
    if state != _SEARCH:
        if state != _GATHER:
            tl.store(out_ptr + i, t.to(tl.int64))
            tl.store(path_ptr + i, path)
    tl.store(nc_ptr + i, 0)


@triton.jit
def _finish_nucleus(cx_ptr, ci_ptr, n_c, t, x_t, m, target, lo_v, k1, k2, FAST_LOG: tl.constexpr, CAP: tl.constexpr):
    """The token of a top-p-alone row from its n_c <= CAP candidates (its tokens > lo_v,
    which hold the nucleus): v_p by the lane lists' bisection (``nucleus_floor``) instead
    of a sort of up to 256 candidates (with read 2's histogram flag at half the lanes, read
    2 of the bench's 6 such rows went 0.050 -> 0.023 ms, session 9); the draw t stands when
    x_t >= v_p, else the best x + g over the candidates >= v_p."""
    offs = tl.arange(0, CAP)
    valid = offs < n_c
    cx = tl.load(cx_ptr + offs, mask=valid, other=-float("inf"), cache_modifier=".cg")
    thr = nucleus_floor(cx, m, target, lo_v)
    tok = t
    if x_t < thr:
        ci = tl.load(ci_ptr + offs, mask=valid, other=0, cache_modifier=".cg")
        noisy = tl.where(cx >= thr, cx + gumbel_noise(col_hash(ci), k1, k2, FAST_LOG), -float("inf"))
        tok = first_argmax(noisy, ci)
    return tok


@triton.jit
def _pivot_search(row, vocab, inv_t, k, p, lmp, m, n_fin, hint, k1, k2, cx, FAST_LOG: tl.constexpr,
                  BLOCK: tl.constexpr, SBLOCK: tl.constexpr, NP: tl.constexpr, CAP: tl.constexpr):
    """Path 3: the exact threshold by the one-program pivot search (hint <= v_p, or -inf)
    and the draw above it, both over the whole row on this program."""
    mn = _min_finite(row, vocab, inv_t, BLOCK, 1)
    thr = row_threshold(row, vocab, inv_t, k, p, lmp, m, mn, n_fin, mn, hint, cx, SBLOCK, NP, CAP)
    t, _a1, _a2, _nf, _z, _tm = gumbel_pass(row, vocab, inv_t, thr, k1, k2, True, False, False, False, FAST_LOG,
                                            BLOCK, 1, 1, 0)
    return t


@triton.jit
def next_round(i, brk_ptr, hist_ptr, row_i_ptr, next_ptr, n_chunks, target, CAP: tl.constexpr, NPV: tl.constexpr,
               NCP: tl.constexpr):
    """A searched row after a round of histograms: its next bracket, and the row on the
    next round's work list, to gather the bracket (at most CAP tokens) or search it."""
    b = brk_ptr + i * (NPV + 4)
    lo_b, hi_b, m_above, n_in = select_bracket(b, hist_ptr + i * n_chunks * (2 * NPV), n_chunks, target, NPV, NCP)
    store_bracket(b, lo_b, hi_b, m_above, NPV)
    return _go_on(i, tl.where(n_in <= CAP, _GATHER, _SEARCH), row_i_ptr, next_ptr)


@triton.jit
def _go_on(i, state, row_i_ptr, next_ptr):
    """Row i in its new state on the next round's work list."""
    state = state + tl.zeros([], tl.int32)  # (a constant state becomes a tensor, as the other branches')
    tl.store(row_i_ptr + i * 4, state)
    tl.store(next_ptr + 4 + tl.atomic_add(next_ptr, 1), i)
    return state


@triton.jit
def _finish_round(i, logits_ptr, s_row, inv_t_ptr, seed_ptr, pos_ptr, top_k_ptr, top_p_ptr, lmp_ptr, row_f_ptr,
                  row_i_ptr, nc_ptr, cx_ptr, ci_ptr, out_ptr, path_ptr, brk_ptr, hist_ptr, next_ptr, vocab, n_chunks,
                  FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, CAP: tl.constexpr, SBLOCK: tl.constexpr,
                  NP: tl.constexpr, NCP: tl.constexpr, SCAND2: tl.constexpr, NPV: tl.constexpr,
                  LAST: tl.constexpr):
    """The end of a histogram round for row i (``split_rounds_triton``): a gathered row
    draws (path 4); a searched one takes its next bracket or, in the last round, the
    one-program pivot search from its bracket's b_lo (path 3)."""
    state = tl.load(row_i_ptr + i * 4)
    target = tl.load(top_p_ptr + i) * tl.load(row_f_ptr + i * 4 + 1)
    b = brk_ptr + i * (NPV + 4)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    cx = cx_ptr + i.to(tl.int64) * CAP
    ci = ci_ptr + i.to(tl.int64) * CAP
    if state == _GATHER:
        m = tl.load(row_f_ptr + i * 4)
        n_c = tl.load(nc_ptr + i)
        h_row = hist_ptr + i * n_chunks * (2 * NPV)
        if n_c <= SCAND2:
            t = draw_in_bracket(cx, ci, n_c, h_row, n_chunks, m, target, tl.load(b + 2), tl.load(b), k1, k2,
                                FAST_LOG, SCAND2, NCP, NPV)
        else:
            t = draw_in_bracket(cx, ci, n_c, h_row, n_chunks, m, target, tl.load(b + 2), tl.load(b), k1, k2,
                                FAST_LOG, CAP, NCP, NPV)
        tl.store(out_ptr + i, t.to(tl.int64))
        tl.store(path_ptr + i, 4)
    elif LAST:
        row = logits_ptr + i.to(tl.int64) * s_row
        t = _pivot_search(row, vocab, tl.load(inv_t_ptr + i), tl.load(top_k_ptr + i), tl.load(top_p_ptr + i),
                          tl.load(lmp_ptr + i), tl.load(row_f_ptr + i * 4), tl.load(row_i_ptr + i * 4 + 1),
                          tl.load(b), k1, k2, cx, FAST_LOG, BLOCK, SBLOCK, NP, CAP)
        tl.store(out_ptr + i, t.to(tl.int64))
        tl.store(path_ptr + i, 3)
    else:
        next_round(i, brk_ptr, hist_ptr, row_i_ptr, next_ptr, n_chunks, target, CAP, NPV, NCP)
    tl.store(nc_ptr + i, 0)
