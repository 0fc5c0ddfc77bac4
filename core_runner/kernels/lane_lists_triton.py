"""Nucleus from read 1 alone: each lane keeps its top tokens, so the row's top tokens
are known exactly without a second read of the logits.

A program of read 1 (one part of a row, BLOCK lanes; a lane is one column residue of
the part's tiles) keeps per lane the largest value with its column (a1, i1), the second
largest (a2; with DEPTH 3 also its column i2) and with DEPTH 3 the third (a3), as the
multiset top of the lane. Let b be the part's bound: the largest a2 of its lanes (DEPTH
2) or the largest a3 (DEPTH 3). A token > b is among its lane's kept entries (else two
(three) larger tokens share its lane, and the lane's a2 (a3) > b). So the part's kept
entries > b are *all* its tokens > b; the program stores them (value, column) in its
list of LIST slots, with their number (more than LIST: overflow) and b.

The decide launch takes T = the largest bound of the row's parts: the lists' entries > T
are all the row's tokens > T. When their mass reaches p Z (and no part overflowed) the
nucleus {x >= v_p} lies among them: v_p = the largest listed value v with
mass{x >= v} >= p Z (a bisection on the float key), and the token is argmax of x + g
over the listed entries >= v_p, the draw of the reference. (Gathering the entries > T
into a quarter or half of the lists' width before the bisection made the decide launch
slower on the H200, 0.032 -> 0.047 ms: session 6. Session 10 brings it back as an option,
``decide_width``, for the registers: with the decide fused into read 1, 2,048 slots on 2
warps keep read 1 above 96 registers (8 programs per SM, not 10); gathered part by part
into 1,024 slots, read 1 fits in 96 without spills on sm90; that measured no faster (H200,
session 11). The Sampler's shape since session 11: the decide in a launch of its own on 2
warps with ``decide_width`` 1,024, the gather loading each part ahead: graph 0.2175 ms a
call against 0.2264 fused.) Otherwise
the row goes on to the lane floor and read 2 (``cut_sample_split_triton``).

How far the lists reach: random logits (N(0, 4^2) / 0.7, vocab 151,936, 8 x 512 lanes)
have nuclei of 31 (median) to ~160 tokens at p = 0.9; DEPTH 2 knows the top ~76 tokens
(median; the first two tokens sharing a lane), DEPTH 3 the top ~440 (the first three),
with ~110 (at most ~240) entries per part. The pass keeps Z per lane (an online sum),
so without tile maxima its loop has no reduction across lanes. What it costs is its
instructions per token: H200, s8 b512 w2, the pass alone (probe): session 6's loop
(scaled values, masked 4-byte loads, ~31 SASS instructions a token) 0.256 ms with tile
maxima; session 7's (raw logits, tile numbers, unmasked 16-byte loads, unrolled by 2:
~17 a token) 0.184 with tile maxima and 0.166 without (a bare read: 0.151).

The finite count of these rows is the number of lanes holding a finite value: it is
only used for top-k (off here) and to tell a row of -inf (0).
"""
from __future__ import annotations

import triton
import triton.language as tl

from core_runner.kernels.gumbel_sample import col_hash, first_argmax, gumbel_noise
from core_runner.kernels.scatter_store import scatter_store
from core_runner.kernels.top_k_top_p_triton import _key, _value


@triton.jit
def _lane_update(x, j, a1, i1, a2, i2, a3, zl, c, DEPTH: tl.constexpr):
    """One tile of raw logits x into the lanes' top entries (a1, i1, a2, i2, a3; i1 and i2
    tile numbers, j this tile's) and their mass zl = sum exp((x - a1) * inv_t), online
    per lane (no reduction across lanes, so no barrier in the loop); c = inv_t * log2(e).
    Comparing raw logits keeps the order of x * inv_t (monotone), so no token is scaled;
    no test for -inf either: a1 is held at -FLT_MAX or above in the difference, and x =
    -inf weighs exp2(-inf) = 0."""
    take1 = x > a1
    e = tl.math.exp2(tl.abs(x - tl.maximum(a1, -3.4028234663852886e38)) * -c)
    zl = tl.where(take1, zl * e + 1.0, zl + e)
    if DEPTH == 3:
        a3 = tl.maximum(a3, tl.minimum(a2, x))
        i2 = tl.where(take1, i1, tl.where(x > a2, j, i2))
    a2 = tl.maximum(a2, tl.minimum(a1, x))
    a1 = tl.maximum(a1, x)
    i1 = tl.where(take1, j, i1)
    return a1, i1, a2, i2, a3, zl


@triton.jit
def _lane_loop(row, lo, hi, c, BLOCK: tl.constexpr, NT: tl.constexpr, DEPTH: tl.constexpr, TMAX: tl.constexpr,
               AHEAD: tl.constexpr):
    """The loop of ``lane_lists_pass`` (c = inv_t * log2(e)). The full tiles are
    read without a mask (so the loads are 16-byte vectors: no per-token address and mask
    work), each AHEAD (2 or 3) tiles ahead (the last full tile is read again past the end,
    never beyond hi); the partial tile, if any, is read once after the loop, masked."""
    lanes = tl.arange(0, BLOCK)
    a1 = tl.full([BLOCK], -float("inf"), tl.float32)
    a2 = tl.full([BLOCK], -float("inf"), tl.float32)
    a3 = tl.full([BLOCK], -float("inf"), tl.float32)
    zl = tl.zeros([BLOCK], tl.float32)
    i1 = tl.zeros([BLOCK], tl.int32)
    i2 = tl.zeros([BLOCK], tl.int32)
    tiles = tl.arange(0, NT)
    tmax = tl.full([NT], float("inf"), tl.float32)
    if TMAX:
        tmax = tl.full([NT], -float("inf"), tl.float32)
    base = row + lo + lanes
    n_full = (hi - lo) // BLOCK
    last = tl.maximum(n_full - 1, 0)
    any_full = lanes < n_full * BLOCK  # all or none (a tensor: the interpreter takes no scalar mask)
    nxt = tl.load(base, mask=any_full, other=-float("inf"))
    nxt2 = tl.load(base + tl.minimum(1, last) * BLOCK, mask=any_full, other=-float("inf"))
    nxt3 = nxt2
    if AHEAD == 3:
        nxt3 = tl.load(base + tl.minimum(2, last) * BLOCK, mask=any_full, other=-float("inf"))
    for j in tl.range(0, n_full, num_stages=1, loop_unroll_factor=2):
        x = nxt.to(tl.float32)
        nxt = nxt2
        if AHEAD == 3:
            nxt2 = nxt3
            nxt3 = tl.load(base + tl.minimum(j + 3, last) * BLOCK)
        else:
            nxt2 = tl.load(base + tl.minimum(j + 2, last) * BLOCK)
        a1, i1, a2, i2, a3, zl = _lane_update(x, j, a1, i1, a2, i2, a3, zl, c, DEPTH)
        if TMAX:
            tmax = tl.where(tiles == j, tl.max(x, axis=0), tmax)
    rest = hi - lo - n_full * BLOCK
    if rest > 0:
        x = tl.load(base + n_full * BLOCK, mask=lanes < rest, other=-float("inf")).to(tl.float32)
        a1, i1, a2, i2, a3, zl = _lane_update(x, n_full, a1, i1, a2, i2, a3, zl, c, DEPTH)
        if TMAX:
            tmax = tl.where(tiles == n_full, tl.max(x, axis=0), tmax)
    return a1, i1, a2, i2, a3, zl, tmax


@triton.jit
def _max_max_add(a, b, c, d, e, f):
    return tl.maximum(a, d), tl.maximum(b, e), c + f


@triton.jit
def lane_lists_pass(row, lo, hi, inv_t, BLOCK: tl.constexpr, NT: tl.constexpr, DEPTH: tl.constexpr,
                    TMAX: tl.constexpr, AHEAD: tl.constexpr = 2):
    """One read of the columns [lo, hi) (lo a multiple of BLOCK) of x = logit * inv_t:
    (a1, i1, a2, i2, bound per lane, the part's bound b (the largest), lanes holding a
    finite x, max m, each lane's mass relative to m (Z = their sum), tile maxima [NT]).
    a2 and i2 are the second entry (i2 meaningless with DEPTH 2); the per-lane bound is a2
    (DEPTH 2) or a3 (DEPTH 3). TMAX false: no per-tile reduction, the tile maxima are +inf
    (a later read of the row then visits every tile). Two tiles are in flight ahead of the
    one being processed. The loop compares raw logits and keeps tile numbers
    (``_lane_update``); they are scaled and turned into columns after it: the same values
    (one multiply each, as the reference's) and the same entries, since x > y implies
    x * inv_t >= y * inv_t (the lists keep entries above the bound in the scaled order,
    where the claim of the module docstring holds as well). m, b and the finite count
    come out of one reduction: each reduction across the program's warps is a round
    through shared memory with barriers, and the epilogue's eight (with the lists' store)
    held ~19% of read 1's warp time (H200, session 10, Nsight Compute's stall samples)."""
    a1, i1, a2, i2, a3, zl, tmax = _lane_loop(row, lo, hi, inv_t * 1.4426950408889634, BLOCK, NT, DEPTH, TMAX,
                                              AHEAD)
    a1 = a1 * inv_t  # (-inf stays)
    a2 = a2 * inv_t
    a3 = a3 * inv_t
    i1 = lo + i1 * BLOCK + tl.arange(0, BLOCK)
    i2 = lo + i2 * BLOCK + tl.arange(0, BLOCK)
    if TMAX:
        tmax = tmax * inv_t
    bound = a2
    if DEPTH == 3:
        bound = a3
    finite = a1 > -float("inf")
    m, b, nf = tl.reduce((a1, bound, finite.to(tl.int32)), 0, _max_max_add)
    zl = tl.where(finite, zl * tl.exp(a1 - m), 0.0)
    return a1, i1, a2, i2, bound, b, nf, m, zl, tmax


@triton.jit
def store_lane_list(a1, i1, a2, i2, b, zl, lx_ptr, li_ptr, ln_ptr, lb_ptr, DEPTH: tl.constexpr,
                    LIST: tl.constexpr, ASM: tl.constexpr):
    """The part's entries above its bound b (all its tokens > b) into its list of LIST
    slots (value, column), their number (> LIST: overflow) and b. One scan places every
    lane's entries (a lane's are adjacent) and also sums the lanes' masses zl: returns
    that running sum, whose last lane is Z (the count is stored from the last lane too,
    so the epilogue needs no reduction beyond ``lane_lists_pass``'s). The stores are
    ``scatter_store``s (ASM: from each thread's own lanes)."""
    sel1 = a1 > b
    cnt = sel1.to(tl.int32)
    sel2 = a2 > b
    if DEPTH == 3:
        cnt += sel2.to(tl.int32)
    end, zs = tl.associative_scan((cnt, zl), 0, _add_pair)
    at1 = end - cnt
    scatter_store(lx_ptr + at1, a1, sel1 & (at1 < LIST), ASM)
    scatter_store(li_ptr + at1, i1, sel1 & (at1 < LIST), ASM)
    if DEPTH == 3:
        at2 = at1 + sel1.to(tl.int32)
        scatter_store(lx_ptr + at2, a2, sel2 & (at2 < LIST), ASM)
        scatter_store(li_ptr + at2, i2, sel2 & (at2 < LIST), ASM)
    last = tl.arange(0, a1.shape[0]) == a1.shape[0] - 1
    scatter_store(ln_ptr + tl.zeros_like(end), end, last, ASM)
    tl.store(lb_ptr, b)
    return zs


@triton.jit
def _add_pair(a, b, c, d):
    return a + c, b + d


@triton.jit
def _bisect(x, w, lo_k, hi_k, c_lo, c_hi, target, above):
    """Steps of ``nucleus_floor``'s bisection from the bracket [lo_k, hi_k) (float keys) with
    c_lo / c_hi entries >= value(lo_k) / value(hi_k), while more than ``above`` entries
    are >= value(lo_k) (0: to the end). w = exp(x - m) (0 off the entries)."""
    for _ in range(0, 33):
        # done once [lo, hi) holds at most one entry: the smallest entry >= value(lo) is then v_p
        if (hi_k - lo_k > 1) & (c_lo - c_hi > 1) & (c_lo > above):
            mid = lo_k + (hi_k - lo_k) // 2
            ge = x >= _value(mid)
            mass, c_mid = tl.reduce((tl.where(ge, w, 0.0), ge.to(tl.int32)), 0, _add_pair)
            if mass >= target:
                lo_k = mid
                c_lo = c_mid
            else:
                hi_k = mid
                c_hi = c_mid
    return lo_k, hi_k, c_lo, c_hi


@triton.jit
def nucleus_floor(x, m, target, big_t):
    """v_p among entries x (> big_t, -inf elsewhere) that hold the nucleus: the smallest
    entry >= the returned value is v_p, by bisection on the float key. Invariant:
    mass{x >= value(lo)} >= p Z > mass{x >= value(hi)}, so v_p is an entry in
    [value(lo), value(hi)); each step's one reduction (mass and count at once) also counts
    the entries left in the bracket, and the loop stops when one is left (or the bracket
    is one key: tied entries), so {entries >= value(lo)} = {entries >= v_p}: ~log2(entries)
    steps, not the ~25 that narrowing [T, max] down to one key took (session 7)."""
    w = tl.where(x > -float("inf"), tl.exp(x - m), 0.0)
    n = tl.sum((x > -float("inf")).to(tl.int32), axis=0)  # entries >= value(lo) (all: they are > T)
    lo_k, _hi, _cl, _ch = _bisect(x, w, _key(big_t), _key(m) + 1, n, tl.zeros([], tl.int32), target, 0)
    return _value(lo_k)


@triton.jit
def _bisect_draw(x, w, ci, lo_k, hi_k, c_lo, c_hi, target, k1, k2, FAST_LOG: tl.constexpr):
    """The rest of the bisection from [lo_k, hi_k) and the draw among the entries x
    (columns ci): argmax of x + g over x >= v_p."""
    lo_k, hi_k, c_lo, c_hi = _bisect(x, w, lo_k, hi_k, c_lo, c_hi, target, 0)
    noisy = tl.where(x >= _value(lo_k), x + gumbel_noise(col_hash(ci), k1, k2, FAST_LOG), -float("inf"))
    return first_argmax(noisy, ci)


@triton.jit
def _draw_in_nucleus(x, w, ci_at, valid, m, target, big_t, k1, k2, sx_ptr, si_ptr, FAST_LOG: tl.constexpr,
                     NARROW: tl.constexpr, ASM: tl.constexpr):
    """argmax of x + g over {x >= v_p} among entries x (> big_t, -inf elsewhere; w their
    exp(x - m), ci_at their columns' addresses) that hold the nucleus. The bisection
    (``nucleus_floor``) runs over all the entries only until at most NARROW are left at or
    above its lower end; those are then moved to the front of the scratch (sx_ptr, si_ptr:
    the row's own lists, whose entries are all in registers by then), and the rest of the
    bisection and the noise, the costly part, run on NARROW lanes instead of all of them
    (the decide's work per row was ~20% of read 1's, session 9). More than NARROW left, or
    NARROW 0: everything on all the entries. The move is a ``scatter_store`` (ASM: inline
    PTX, without the layout round trip through shared memory). The columns are read past
    L1 (.cg): ``_gather_above`` may have rewritten them after reading the old ones there."""
    n = tl.sum(valid.to(tl.int32), axis=0)
    lo_k, hi_k, c_lo, c_hi = _bisect(x, w, _key(big_t), _key(m) + 1, n, tl.zeros([], tl.int32), target, NARROW)
    tok = tl.zeros([], tl.int32)
    if NARROW == 0:
        ci = tl.load(ci_at, mask=valid, other=0, cache_modifier=".cg")
        tok = _bisect_draw(x, w, ci, lo_k, hi_k, c_lo, c_hi, target, k1, k2, FAST_LOG)
    elif c_lo <= NARROW:
        sel = x >= _value(lo_k)
        ci = tl.load(ci_at, mask=sel, other=0, cache_modifier=".cg")
        at = tl.cumsum(sel.to(tl.int32), axis=0) - 1
        tl.debug_barrier()  # every lane's loads of the lists before they are overwritten
        scatter_store(sx_ptr + at, x, sel, ASM)
        scatter_store(si_ptr + at, ci, sel, ASM)
        tl.debug_barrier()
        offs = tl.arange(0, NARROW)
        held = offs < c_lo
        xn = tl.load(sx_ptr + offs, mask=held, other=-float("inf"), cache_modifier=".cg")
        cn = tl.load(si_ptr + offs, mask=held, other=0, cache_modifier=".cg")
        wn = tl.where(held, tl.exp(xn - m), 0.0)
        tok = _bisect_draw(xn, wn, cn, lo_k, hi_k, c_lo, c_hi, target, k1, k2, FAST_LOG)
    else:
        ci_all = tl.load(ci_at, mask=valid, other=0, cache_modifier=".cg")
        tok = _bisect_draw(x, w, ci_all, lo_k, hi_k, c_lo, c_hi, target, k1, k2, FAST_LOG)
    return tok.to(tl.int64)


@triton.jit
def _gather_above(lx_ptr, li_ptr, ln_ptr, n_parts, big_t, m, LIST: tl.constexpr, DW: tl.constexpr,
                  P: tl.constexpr, ASM: tl.constexpr):
    """The lists' entries > big_t moved to the front of the row's lists (part by part, in
    order; at most DW kept): (their number, their mass sum exp(x - m)). In place: the
    entries of parts 0..s fill at most the slots of parts 0..s (no part holds more than
    LIST), and a part's entries are in registers before any slot is written. So the next
    part's values and columns are loaded before this part's are written (one load round
    trip a part, overlapped with the part before: the loop is a chain of n_parts steps,
    and the decide's time is its latency); the counts come in one load before the loop."""
    offs = tl.arange(0, LIST)
    parts = tl.arange(0, P)
    counts = tl.load(ln_ptr + parts, mask=parts < n_parts, other=0)
    n = tl.zeros([], tl.int32)
    mass = tl.zeros([], tl.float32)
    held = offs < tl.sum(tl.where(parts == 0, counts, 0), axis=0)
    x_next = tl.load(lx_ptr + offs, mask=held, other=-float("inf"))
    ci_next = tl.load(li_ptr + offs, mask=held, other=0)
    for s in range(0, n_parts):
        x = x_next
        ci = ci_next
        held = offs < tl.sum(tl.where(parts == s + 1, counts, 0), axis=0)  # (none past the last part)
        x_next = tl.load(lx_ptr + (s + 1) * LIST + offs, mask=held, other=-float("inf"))
        ci_next = tl.load(li_ptr + (s + 1) * LIST + offs, mask=held, other=0)
        sel = x > big_t
        at = n + tl.cumsum(sel.to(tl.int32), axis=0) - 1
        keep = sel & (at < DW)
        k, w = tl.reduce((sel.to(tl.int32), tl.where(sel, tl.exp(x - m), 0.0)), 0, _add_pair)
        tl.debug_barrier()  # the part's loads and the next one's (every lane's) before its slots may be written
        scatter_store(lx_ptr + at, x, keep, ASM)
        scatter_store(li_ptr + at, ci, keep, ASM)
        n += k
        mass += w
    tl.debug_barrier()  # the moves before the reads of ``nucleus_from_lists``
    return n, mass


@triton.jit
def nucleus_from_lists(lx_ptr, li_ptr, ln_ptr, lb_ptr, n_parts, m, z, p, k1, k2, FAST_LOG: tl.constexpr,
                       P: tl.constexpr, LIST: tl.constexpr, NARROW: tl.constexpr, ASM: tl.constexpr,
                       DW: tl.constexpr):
    """(token, ok) of a top-p-alone row from its parts' lists (pointers at the row's first
    part): ok false when the lists do not hold the nucleus (module docstring). When ok,
    the row's lists are scratch for the draw (``_draw_in_nucleus``, NARROW lanes; 0: all
    the slots) and are left changed. DW 0: the draw starts on all P x LIST slots (2,048 at
    the Sampler's shape: 32 values a thread on read 1's 2 warps, which with the fused
    decide keeps read 1 above 96 registers); DW > 0: the entries > T are first moved to
    the front (``_gather_above``, LIST slots at a time) and the draw runs on DW slots (more
    than DW entries: not ok, the row goes on to read 2)."""
    target = p * z
    tok = tl.zeros([], tl.int64)
    if DW == 0:
        r = tl.arange(0, P * LIST)
        part = r // LIST
        has_part = part < n_parts
        cnt = tl.load(ln_ptr + part, mask=has_part, other=0)
        big_t = tl.max(tl.load(lb_ptr + part, mask=has_part, other=-float("inf")), axis=0)
        held = has_part & (r % LIST < cnt)
        x = tl.load(lx_ptr + r, mask=held, other=-float("inf"))
        valid = held & (x > big_t)
        x = tl.where(valid, x, -float("inf"))
        w = tl.where(valid, tl.exp(x - m), 0.0)
        ok = (tl.max(cnt, axis=0) <= LIST) & (tl.sum(w, axis=0) >= target)
        if ok:
            tok = _draw_in_nucleus(x, w, li_ptr + r, valid, m, target, big_t, k1, k2, lx_ptr, li_ptr, FAST_LOG,
                                   NARROW, ASM)
    else:
        parts = tl.arange(0, P)
        has = parts < n_parts
        big_t = tl.max(tl.load(lb_ptr + parts, mask=has, other=-float("inf")), axis=0)
        ok = tl.max(tl.load(ln_ptr + parts, mask=has, other=0), axis=0) <= LIST
        if ok:
            n, mass = _gather_above(lx_ptr, li_ptr, ln_ptr, n_parts, big_t, m, LIST, DW, P, ASM)
            ok = (n <= DW) & (mass >= target)
            if ok:
                o = tl.arange(0, DW)
                held = o < n
                x = tl.load(lx_ptr + o, mask=held, other=-float("inf"), cache_modifier=".cg")
                w = tl.where(held, tl.exp(x - m), 0.0)
                tok = _draw_in_nucleus(x, w, li_ptr + o, held, m, target, big_t, k1, k2, lx_ptr, li_ptr, FAST_LOG,
                                       NARROW, ASM)
    return tok, ok
