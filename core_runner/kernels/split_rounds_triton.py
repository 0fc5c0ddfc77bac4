"""Histogram rounds of the split cut sampler: the nucleus of a flat row (more tokens in
read 2's reach than the candidates' capacity) found over many programs instead of one.

A row the lane lists miss goes to read 2 (``split_read2_triton``) with a bracket
[b_lo, b_hi) that holds v_p (the nucleus threshold: the largest value v with
mass{x >= v} >= p Z), the mass M above it (0 at first) and NPV pivots b_lo = e_0 < e_1
< ... < e_{NPV-1} < b_hi, spread evenly. The decide sets the first one: b_hi just above
the max m, b_lo = m + log((1 - p) Z / V) (the V tokens under b_lo weigh less than
(1 - p) Z, so v_p >= b_lo), raised to read 2's lo when the lane floor holds v_p.

Read 2 takes the first histogram only for rows the decide flags as flat (many lane
maxima above lo): on the few peaked rows the lane lists miss it would cost a 32-pivot pass
for nothing; an unflagged row that overflows searches in the first round instead.

Each chunk of a searched row stores, per pivot, the mass and number of its tokens in
[e_j, b_hi) (``hist_chunk``); the row's finish sums the chunks in chunk order, and the
largest j with M + mass_j >= p Z gives the next bracket [e_j, e_{j+1}) (``select_bracket``).
When that bracket holds at most CAP tokens the next round gathers them (state
``_GATHER``: ``gather_chunk`` stores them as candidates and keeps, per chunk, the best
x + g over the tokens >= b_hi, all inside the nucleus); the finish then finds v_p among
the candidates from the mass above and draws (``draw_in_bracket``, path 4). Otherwise
the next round searches the bracket again (state ``_SEARCH``). A row still searching in
the last round takes the one-program pivot search (path 3) from b_lo.

Pivots are stored by whoever chooses the bracket and read by the chunks, so the chunks
and the finish compare against the same floats.

Arithmetic on N(0, s^2) / 0.7 rows, vocab 151,936, 32 pivots: s = 2 (~9,000 tokens in
the nucleus at p = 0.9) leaves ~2,000 tokens in the bracket after read 2, one gather
round; s = 1 (~67,000) leaves ~10,000, one more search round.
"""
from __future__ import annotations

import triton
import triton.language as tl

from core_runner.kernels.gumbel_sample import _BIG, col_hash, first_argmax, gumbel_noise
from core_runner.kernels.lane_lists_triton import nucleus_floor
from core_runner.kernels.scatter_store import scatter_store
from core_runner.kernels.top_k_top_p_triton import _key, _value

# row states of the rounds (after those of ``split_finish_triton``)
_SEARCH = tl.constexpr(3)
_GATHER = tl.constexpr(4)


@triton.jit
def store_bracket(b_ptr, lo_b, hi_b, m_above, NPV: tl.constexpr):
    """A row's bracket record: [b_lo, b_hi, M, read 2's histogram (1.0) or not, e_0 .. e_{NPV-1}]."""
    tl.store(b_ptr, lo_b)
    tl.store(b_ptr + 1, hi_b)
    tl.store(b_ptr + 2, m_above)
    j = tl.arange(0, NPV)
    tl.store(b_ptr + 4 + j, lo_b + j.to(tl.float32) * ((hi_b - lo_b) / NPV))


@triton.jit
def first_bracket(b_ptr, m, z, p, lo, floor_holds, wide, vocab, NPV: tl.constexpr):
    """The decide's bracket for a row sent to read 2 (module docstring); wide: read 2 also
    takes its histogram (else a row whose candidates overflow searches in the first round)."""
    lo_b = m + tl.log((1.0 - p) * z / vocab)
    if floor_holds:
        lo_b = tl.maximum(lo_b, lo)
    store_bracket(b_ptr, lo_b, _value(_key(m) + 1), 0.0, NPV)
    tl.store(b_ptr + 3, wide.to(tl.float32))


@triton.jit
def hist_chunk(row, c, inv_t, m, b_ptr, h_ptr, vocab, CHUNK: tl.constexpr, NPV: tl.constexpr):
    """Chunk c of a row: per pivot e_j the mass (relative to m) and number of its tokens in
    [e_j, b_hi), into h_ptr[0:NPV] and h_ptr[NPV:2 NPV] (the chunk's slots). The chunk is
    read and exponentiated once (1D, a few tokens per thread), then 4 pivots at a time
    are a [4, CHUNK] comparison summed along the chunk: each thread keeps its own tokens
    for all 4 (no data moves), one reduction pass of 4 rows (sm90: ~590 SASS instructions
    and 10 barriers an iteration). (Session 8's [64 x 32] tiles of (token, pivot) pairs
    had each thread load and exponentiate 16 tokens per 64-column sub-tile: every token 32
    times over, ~330 SASS instructions a sub-tile; flat rows spent ~45 us per chunk.)"""
    hi_b = tl.load(b_ptr + 1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
    x = tl.where(x < hi_b, x, -float("inf"))  # (-inf is under every pivot)
    e = tl.where(x > -float("inf"), tl.exp(x - m), 0.0)
    four = tl.arange(0, 4)
    for j in range(0, NPV, 4):
        ge = x[None, :] >= tl.load(b_ptr + 4 + j + four)[:, None]  # [4, CHUNK]: 4 pivots
        tl.store(h_ptr + j + four, tl.sum(tl.where(ge, e[None, :], 0.0), axis=1))
        tl.store(h_ptr + NPV + j + four, tl.sum(ge.to(tl.int32), axis=1).to(tl.float32))


@triton.jit
def gather_chunk(row, i, c, inv_t, k1, k2, b_ptr, h_ptr, nc_ptr, cx_ptr, ci_ptr, vocab, FAST_LOG: tl.constexpr,
                 CAP: tl.constexpr, CHUNK: tl.constexpr, ASM: tl.constexpr):
    """Chunk c of a gathered row: its tokens in [b_lo, b_hi) into the row's candidates, and
    the best x + g over its tokens >= b_hi (score, column) into h_ptr[0:2]."""
    lo_b = tl.load(b_ptr)
    hi_b = tl.load(b_ptr + 1)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32) * inv_t
    inb = (x >= lo_b) & (x < hi_b)
    cnt = tl.sum(inb.to(tl.int32), axis=0)
    if cnt > 0:
        at = tl.atomic_add(nc_ptr + i, cnt) + tl.cumsum(inb.to(tl.int32), axis=0) - 1
        scatter_store(cx_ptr + i.to(tl.int64) * CAP + at, x, inb & (at < CAP), ASM)
        scatter_store(ci_ptr + i.to(tl.int64) * CAP + at, cols, inb & (at < CAP), ASM)
    best = -float("inf")
    col = tl.zeros([], tl.int32)
    if tl.max(x, axis=0) >= hi_b:
        noisy = tl.where(x >= hi_b, x + gumbel_noise(col_hash(cols), k1, k2, FAST_LOG), -float("inf"))
        best = tl.max(noisy, axis=0)
        col = first_argmax(noisy, cols)
    tl.store(h_ptr, best)
    tl.store(h_ptr + 1, col.to(tl.float32))  # (exact: columns < 2^24)


@triton.jit
def select_bracket(b_ptr, h_row, n_chunks, target, NPV: tl.constexpr, NCP: tl.constexpr):
    """The sub-bracket [e_j, e_{j+1}) of a searched row that holds v_p (module docstring):
    (its b_lo, b_hi, the mass above it, its number of tokens)."""
    hi_b = tl.load(b_ptr + 1)
    m_above = tl.load(b_ptr + 2)
    j = tl.arange(0, NPV)
    ch = tl.arange(0, NCP)
    at = h_row + ch[:, None] * (2 * NPV) + j[None, :]
    ok = (ch < n_chunks)[:, None]
    mass = tl.sum(tl.load(at, mask=ok, other=0.0), axis=0)
    cnt = tl.sum(tl.load(at + NPV, mask=ok, other=0.0), axis=0)
    # mass is cumulative (tokens >= e_j), so the pivots that reach p Z are a prefix; none by a
    # rounding hair (the previous round summed another way): the bracket's first
    js = tl.maximum(tl.sum((m_above + mass >= target).to(tl.int32), axis=0) - 1, 0)
    piv = tl.load(b_ptr + 4 + j)
    top = js == NPV - 1
    new_lo = tl.max(tl.where(j == js, piv, -float("inf")), axis=0)
    new_hi = tl.where(top, hi_b, tl.max(tl.where(j == js + 1, piv, -float("inf")), axis=0))
    new_above = m_above + tl.sum(tl.where(j == js + 1, mass, 0.0), axis=0)
    n_in = tl.sum(tl.where(j == js, cnt, 0.0), axis=0) - tl.sum(tl.where(j == js + 1, cnt, 0.0), axis=0)
    return new_lo, new_hi, new_above, n_in


@triton.jit
def draw_in_bracket(cx_ptr, ci_ptr, n_c, h_row, n_chunks, m, target, m_above, lo_b, k1, k2, FAST_LOG: tl.constexpr,
                    CAP: tl.constexpr, NCP: tl.constexpr, NPV: tl.constexpr):
    """The token of a gathered row: v_p among the candidates (all >= b_lo) by the lane
    lists' bisection (``nucleus_floor``: no sort, which at CAP = 4,096 entries took
    milliseconds a row on the H200) for the mass p Z - M still needed below the bracket's
    top, the best x + g over the candidates >= v_p, against the chunks' best above the
    bracket (ties: the smaller column)."""
    offs = tl.arange(0, CAP)
    valid = offs < n_c
    cx = tl.load(cx_ptr + offs, mask=valid, other=-float("inf"), cache_modifier=".cg")
    ci = tl.load(ci_ptr + offs, mask=valid, other=0, cache_modifier=".cg")
    thr = nucleus_floor(cx, m, target - m_above, _value(_key(lo_b) - 1))
    noisy = tl.where(valid & (cx >= thr), cx + gumbel_noise(col_hash(ci), k1, k2, FAST_LOG), -float("inf"))
    best_in = tl.max(noisy, axis=0)
    tok_in = first_argmax(noisy, ci)
    ch = tl.arange(0, NCP)
    sc = tl.load(h_row + ch * (2 * NPV), mask=ch < n_chunks, other=-float("inf"))
    col = tl.load(h_row + ch * (2 * NPV) + 1, mask=ch < n_chunks, other=0.0).to(tl.int32)
    best_up = tl.max(sc, axis=0)
    tok_up = tl.min(tl.where(sc == best_up, col, _BIG), axis=0)
    tok = tl.where(best_up > best_in, tok_up, tok_in)
    tok = tl.where(best_up == best_in, tl.minimum(tok_up, tok_in), tok)
    return tok
