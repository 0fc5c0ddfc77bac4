"""Read 2 of the split cut sampler (``cut_sample_split_triton``, step 3): for each row
the decide launch sent on (state ``_READ2``), every program of the row sums the mass of
its part's tokens > lo and stores those tokens as the row's candidates. Also the row
states that the decide launch leaves for read 2 and the finish.
"""
from __future__ import annotations

import triton
import triton.language as tl

from core_runner.kernels.gumbel_sample import row_part

# row states after the decide launch
_DONE = tl.constexpr(0)
_READ2 = tl.constexpr(1)  # top-p alone, draw below the max: read 2 and the finish
_ONE_PROGRAM = tl.constexpr(2)  # other cuts: the one-program path in the finish


@triton.jit
def _part_tile(base, j, n_full, rest, lanes, BLOCK: tl.constexpr):
    """Tile j of a part (base: its first column's pointers): unmasked (16-byte loads) when
    full, else the rest columns of the partial tile and -inf past them (all -inf past it)."""
    if j < n_full:
        x = tl.load(base + j * BLOCK)
    else:
        x = tl.load(base + j * BLOCK, mask=lanes < rest - (j - n_full) * BLOCK, other=-float("inf"))
    return x


@triton.jit
def _above(raw, j, inv_t, lo_v, tm_row, TMAX: tl.constexpr):
    """Tile j scaled, and which of its tokens are > lo_v (none when read 1's tile max says
    so, with TMAX)."""
    x = raw.to(tl.float32) * inv_t
    lo_t = lo_v
    if TMAX:
        lo_t = tl.where(tl.load(tm_row + j) > lo_v, lo_v, float("inf"))
    return x, x > lo_t


@triton.jit
def _read2_kernel(logits_ptr, s_row, inv_t_ptr, row_f_ptr, row_i_ptr, tmax_ptr, nc_ptr, part_a_ptr, cx_ptr, ci_ptr,
                  vocab, part, n_parts, n_tiles, BLOCK: tl.constexpr, CAP: tl.constexpr, TMAX: tl.constexpr):
    """Read 2 of program (i, s) on a row the decide launch sent here, in two passes over
    the part, each with two tiles in flight, with no reduction or atomic inside a loop (a loop that
    summed and took slots per tile cost ~50 us for a handful of rows on the H200, session
    7): pass A counts per lane the tokens > lo and sums their mass; one atomic add takes
    the part's slots; pass B (the part again, from L2) stores each lane's tokens at its
    own offset. With TMAX (read 1 kept tile maxima) a tile whose max is not above lo is
    left out in both passes."""
    i, s, row, lo, hi, inv_t = row_part(logits_ptr, s_row, inv_t_ptr, vocab, part)
    if tl.load(row_i_ptr + i * 4) == _READ2:
        m = tl.load(row_f_ptr + i * 4)
        lo_v = tl.load(row_f_ptr + i * 4 + 2)
        lanes = tl.arange(0, BLOCK)
        tm_row = tmax_ptr + i.to(tl.int64) * n_tiles + lo // BLOCK
        base = row + lo + lanes
        n_full = (hi - lo) // BLOCK
        rest = hi - lo - n_full * BLOCK
        n_t = tl.cdiv(hi - lo, BLOCK)
        a = tl.zeros([BLOCK], dtype=tl.float32)
        cnt = tl.zeros([BLOCK], dtype=tl.int32)
        nxt = _part_tile(base, 0, n_full, rest, lanes, BLOCK)
        nxt2 = _part_tile(base, 1, n_full, rest, lanes, BLOCK)
        for jj in range(0, n_t):
            x, gt = _above(nxt, jj, inv_t, lo_v, tm_row, TMAX)
            nxt = nxt2
            nxt2 = _part_tile(base, jj + 2, n_full, rest, lanes, BLOCK)
            a += tl.where(gt, tl.exp(x - m), 0.0)
            cnt += gt.to(tl.int32)
        tl.store(part_a_ptr + i * n_parts + s, tl.sum(a, axis=0))
        total = tl.sum(cnt, axis=0)
        if total > 0:
            at = tl.atomic_add(nc_ptr + i, total) + tl.cumsum(cnt, axis=0) - cnt
            cx = cx_ptr + i.to(tl.int64) * CAP
            ci = ci_ptr + i.to(tl.int64) * CAP
            nxt = _part_tile(base, 0, n_full, rest, lanes, BLOCK)
            nxt2 = _part_tile(base, 1, n_full, rest, lanes, BLOCK)
            for jj in range(0, n_t):
                x, gt = _above(nxt, jj, inv_t, lo_v, tm_row, TMAX)
                nxt = nxt2
                nxt2 = _part_tile(base, jj + 2, n_full, rest, lanes, BLOCK)
                tl.store(cx + at, x, mask=gt & (at < CAP))
                tl.store(ci + at, lo + jj * BLOCK + lanes, mask=gt & (at < CAP))
                at += gt.to(tl.int32)
