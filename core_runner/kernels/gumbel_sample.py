"""Gumbel-Max sampling in one pass over the logits (Triton twin of
``core_runner.sample.sampler.gumbel_sample_ref``, drawing the very numbers of
``core_runner.sample.rng``).

One program per request streams its logits row in tiles of BLOCK columns, scales it by
the inverse temperature, optionally drops the tokens below a given threshold, adds
Gumbel noise made by the stateless hash keyed by (seed, position, vocab index) and
keeps a running maximum *per lane* (column mod BLOCK): a strict '>' per lane keeps the
first column of each lane's maximum, and the one reduction at the end takes the
smallest column among the lanes that hold the row maximum, so ties resolve as torch's
argmax (first index). Rows with inverse temperature 0 (greedy) skip the noise: plain
argmax of the raw logits. Nothing of size batch x vocab is allocated. The inverse
temperature comes from torch (IEEE division), so x * (1 / T) is the same number here
and in the reference.

The hash runs in native uint32 arithmetic (Triton's uint32 multiply wraps mod 2**32, as
the int64 16-bit-half products of rng.py do; tests compare the two bit for bit). The
noise is -log(-log(u)). The inner log must be accurate in *relative* terms near u = 1
(those tokens get the largest noise), so it is ``tl.log`` (libdevice logf). The outer
log takes values in [6e-8, 17] where an absolute error of ~1e-7 is harmless, so on an
NVIDIA GPU it is ``libdevice.fast_logf`` (one lg2.approx), and ``tl.log`` elsewhere
(the interpreter has no libdevice): CPU and GPU noise agree to ~1e-7, as two libms do.
u is clamped below 1 as in rng.py. It loads the next tile before working on the current
one, which hides the load latency without the shared-memory staging of a pipelined loop.

Most tokens never get the two logs (they cost ~30 instructions of a ~50-instruction
token; the pass would be compute-bound): once a tile has set the row's best noisy value
B, a token can only win if x + g >= B, and its noise is bounded by its hash alone.
With W = 2**24 - 1 - (top 24 bits of h), 1 - u >= W / 2**24 and -log(u) >= 1 - u, so
g = -log(-log(u)) <= log(2**24 / W): the token is skipped when W > 2**24 exp(x - B + eps)
(one exp2 and a float compare of the bit pattern 2**23 + W / 2, no int->float
conversion; eps covers the float error of the noise and of x + g). A tile with no
token left is skipped; so is a tile whose max is over G_MAX (the noise of U_MAX) below
B, before hashing. Skipped tokens lie strictly below B, so the token and its tie rule
(first index) are those of the full computation. The expected number of tokens that
pass the test in a tile is about (the tile's share of the mass) / (the share seen so
far), whatever the distribution: a handful of the ~75 tiles of a 151,936 row.

(Tried and dropped, session 5: hashing only the tokens within G_MAX of the best through
a per-program scratch was 1.9x slower on the H200 than hashing every token.)

``gumbel_pass`` and ``argmax_pass`` are shared with the fused cut sampler
(``cut_sample_triton.py``), which also asks ``gumbel_pass`` for the row statistics it
needs (per-lane maximum and second maximum, number of finite tokens).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

# rng.GOLDEN, M1, M2 and U_MAX; the kernel test compares the two draws bit for bit.
_GOLDEN = tl.constexpr(0x9E3779B1)
_U_MAX = tl.constexpr(1.0 - 2.0**-24)
_BIG = tl.constexpr(2**31 - 1)
# the largest noise -log(-log(U_MAX)) = 16.6355, plus room for the float error
_G_MAX = tl.constexpr(16.7)


def use_fast_log(device: torch.device) -> bool:
    """libdevice's fast log exists on NVIDIA GPUs only (not in the interpreter)."""
    return device.type == "cuda" and torch.version.cuda is not None and os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    return x ^ (x >> 16)


@triton.jit
def row_keys(seed_ptr, pos_ptr, i):
    """The two uint32 keys of row i (rng.row_keys)."""
    seed = tl.load(seed_ptr + i).to(tl.int64)
    lo = seed.to(tl.uint32)
    hi = (seed >> 32).to(tl.uint32)
    pos = tl.load(pos_ptr + i).to(tl.int64).to(tl.uint32)
    k1 = _fmix32(lo ^ _fmix32(hi ^ ((pos + 1) * _GOLDEN)))
    k2 = _fmix32(k1 ^ 0xC2B2AE35)
    return k1, k2


@triton.jit
def col_hash(cols):
    """(col + 1) * GOLDEN mod 2**32, the per-column input of the hash."""
    return (cols.to(tl.uint32) + 1) * _GOLDEN


@triton.jit
def token_hash(hc, k1, k2):
    """The 32-bit hash of the columns whose ``col_hash`` is hc under a row's keys (rng.uniform)."""
    return _fmix32(hc ^ k1) ^ k2


@triton.jit
def hash_uniform(hc, k1, k2):
    """float32 uniforms in (0, 1) of the columns whose ``col_hash`` is hc (rng.uniform)."""
    return _uniform_of_hash(token_hash(hc, k1, k2))


@triton.jit
def _uniform_of_hash(h):
    return tl.minimum(((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), _U_MAX)


@triton.jit
def gumbel_noise(hc, k1, k2, FAST_LOG: tl.constexpr):
    """Gumbel noise of the columns whose ``col_hash`` is hc (rng.gumbel)."""
    return _noise_of_hash(token_hash(hc, k1, k2), FAST_LOG)


@triton.jit
def _noise_of_hash(h, FAST_LOG: tl.constexpr):
    e = -tl.log(_uniform_of_hash(h))
    if FAST_LOG:
        g = -libdevice.fast_logf(e)
    else:
        g = -tl.log(e)
    return g


@triton.jit
def first_argmax(best, idx):
    """Smallest index among the lanes holding the maximum of ``best``."""
    top = tl.max(best, axis=0)
    return tl.min(tl.where(best == top, idx, _BIG), axis=0)


@triton.jit
def _could_reach(x, h, best_row):
    """False only where x + noise(h) < best_row for sure (see the module docstring)."""
    # 2**23 + floor(W / 2) as a float, W = 2**24 - 1 - (top 24 bits of h): 1 - u >= W / 2**24
    wf = (((h ^ 0xFFFFFFFF) >> 9) | 0x4B000000).to(tl.float32, bitcast=True)
    margin = 1e-3 + 4e-6 * tl.abs(best_row)  # float error of the noise and of x + noise
    r = 8388608.0 + 8388608.0 * tl.math.exp2((x - best_row + margin) * 1.4426950408889634)
    return ~(wf > r)  # a NaN bound (inf - inf) counts as "could"


@triton.jit
def _draw(x, h, idx, best, bidx, best_row, FAST_LOG: tl.constexpr):
    """Lane-wise running argmax of x + noise(h) over columns idx (strict '>': a lane keeps
    the first column of its maximum), skipped when no token's hash lets it reach best_row;
    returns (best, bidx, best_row)."""
    if tl.max(_could_reach(x, h, best_row).to(tl.int32), axis=0) > 0:
        v = x + _noise_of_hash(h, FAST_LOG)
        take = v > best
        best = tl.where(take, v, best)
        bidx = tl.where(take, idx, bidx)
        best_row = tl.max(best, axis=0)
    return best, bidx, best_row


@triton.jit
def gumbel_pass(row, vocab, inv_t, thr, k1, k2, HAS_THR: tl.constexpr, STATS: tl.constexpr,
                TOP2: tl.constexpr, ZSTATS: tl.constexpr, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr,
                NT: tl.constexpr, NS: tl.constexpr, lo, DRAW: tl.constexpr = True):
    """argmax over x = logit * inv_t (x >= thr when HAS_THR) of x + noise, one read of
    the columns [lo, vocab) (lo a multiple of BLOCK).

    DRAW false: the statistics alone, no token hashed, no draw code compiled (the returned
    token is then lo, meaningless).

    Returns (token, lane max of x, lane second max of x (TOP2), number of finite x, row
    mass Z = sum exp(x - max x) (ZSTATS), tile maxima of x (ZSTATS: [NT], -inf past the
    last tile; never with HAS_THR: they are of the whole row)); the statistics are computed
    when STATS is set (before the threshold)."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -float("inf"), tl.float32)
    bidx = lo + lanes
    best_row = tl.full([], -float("inf"), tl.float32)  # max of best: a token that can win reaches it
    a1 = tl.full([BLOCK], -float("inf"), tl.float32)
    a2 = tl.full([BLOCK], -float("inf"), tl.float32)
    nf = tl.zeros([BLOCK], dtype=tl.int32)
    tiles = tl.arange(0, NT)
    tmax = tl.full([NT], -float("inf"), tl.float32)
    zm = tl.full([], -float("inf"), tl.float32)  # running max of x and the mass relative to it
    z = tl.zeros([], tl.float32)
    hc = col_hash(lo + lanes)
    nxt = tl.load(row + lo + lanes, mask=lo + lanes < vocab, other=-float("inf"))
    for start in tl.range(lo, vocab, BLOCK, num_stages=NS):
        cols = start + lanes
        x = nxt.to(tl.float32) * inv_t
        # the next tile's load is in flight while this one is hashed
        nxt = tl.load(row + BLOCK + cols, mask=cols + BLOCK < vocab, other=-float("inf"))
        if STATS:
            nf += (x > -float("inf")).to(tl.int32)
            if TOP2:
                a2 = tl.maximum(a2, tl.minimum(a1, x))
            a1 = tl.maximum(a1, x)
        if HAS_THR:
            x = tl.where(x >= thr, x, -float("inf"))
        xm = tl.max(x, axis=0)  # one reduction: the tile max for Z and for the skip test
        if ZSTATS:
            tmax = tl.where(tiles == (start - lo) // BLOCK, xm, tmax)
            new_m = tl.maximum(zm, xm)
            safe_m = tl.where(new_m > -float("inf"), new_m, 0.0)
            s = tl.sum(tl.math.exp2((x - safe_m) * 1.4426950408889634), axis=0)
            z = z * tl.math.exp2((zm - safe_m) * 1.4426950408889634) + s
            zm = new_m
        # noise never exceeds G_MAX (u <= U_MAX): a tile whose max is that far below the
        # best noisy value cannot win; else only tokens whose hash bounds their noise
        # high enough get the two logs
        if DRAW:
            if xm + _G_MAX >= best_row:
                best, bidx, best_row = _draw(x, token_hash(hc, k1, k2), cols, best, bidx, best_row, FAST_LOG)
        hc += (BLOCK * 0x9E3779B1) & 0xFFFFFFFF
    if ZSTATS:
        z = tl.where(zm > -float("inf"), z, 0.0)
    return first_argmax(best, bidx), a1, a2, tl.sum(nf, axis=0), z, tmax


@triton.jit
def argmax_pass(row, vocab, BLOCK: tl.constexpr, NS: tl.constexpr, lo):
    """Plain argmax of the raw logits in columns [lo, vocab) (first index of the maximum), one read."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -float("inf"), tl.float32)
    bidx = lo + lanes
    for start in tl.range(lo, vocab, BLOCK, num_stages=NS):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < vocab, other=-float("inf")).to(tl.float32)
        take = x > best
        best = tl.where(take, x, best)
        bidx = tl.where(take, cols, bidx)
    return first_argmax(best, bidx)


@triton.jit
def row_part(logits_ptr, s_row, inv_t_ptr, vocab, part, PARTS_FIRST: tl.constexpr = False):
    """Program (i, s) of a (rows x parts) grid, or with PARTS_FIRST of a (parts x rows) one
    (then a row's programs start one after another): row i, its row pointer, the part's
    columns [lo, hi) and the row's inverse temperature."""
    i = tl.program_id(0)
    s = tl.program_id(1)
    if PARTS_FIRST:
        i = tl.program_id(1)
        s = tl.program_id(0)
    lo = s * part
    return i, s, logits_ptr + i.to(tl.int64) * s_row, lo, tl.minimum(lo + part, vocab), tl.load(inv_t_ptr + i)


@triton.jit
def _gumbel_argmax_kernel(
    logits_ptr, s_row, inv_t_ptr, thr_ptr, seed_ptr, pos_ptr, out_ptr, vocab, part,
    HAS_THR: tl.constexpr, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr, NS: tl.constexpr,
):
    """Program (i, s) draws row i over its columns [s * part, (s + 1) * part); with one
    program per row (part >= vocab) that is the row's token, else the part's (then
    ``_combine_parts_kernel`` picks among the parts)."""
    i, s, row, lo, hi, inv_t = row_part(logits_ptr, s_row, inv_t_ptr, vocab, part)
    if inv_t > 0:
        thr = -float("inf")
        if HAS_THR:
            thr = tl.load(thr_ptr + i)
        k1, k2 = row_keys(seed_ptr, pos_ptr, i)
        tok, _a1, _a2, _nf, _z, _tm = gumbel_pass(row, hi, inv_t, thr, k1, k2, HAS_THR, False, False, False,
                                                  FAST_LOG, BLOCK, 1, NS, lo)
    else:
        tok = argmax_pass(row, hi, BLOCK, NS, lo)
    tl.store(out_ptr + i * tl.num_programs(1) + s, tok.to(tl.int64))


@triton.jit
def combine_part_tokens(row, part_tok_ptr, n_parts, inv_t, thr, k1, k2, HAS_THR: tl.constexpr,
                        FAST_LOG: tl.constexpr, P: tl.constexpr):
    """The row's token from its parts' tokens: the noisy value (raw logit when greedy)
    of each is computed again by the same expressions, the largest wins, ties go to the
    smallest column (the parts are disjoint and each holds its first maximum)."""
    offs = tl.arange(0, P)
    ok = offs < n_parts
    tok = tl.load(part_tok_ptr + offs, mask=ok, other=0)
    x = tl.load(row + tok, mask=ok, other=-float("inf")).to(tl.float32)
    if inv_t > 0:
        x = x * inv_t
        if HAS_THR:
            x = tl.where(x >= thr, x, -float("inf"))
        x = x + gumbel_noise(col_hash(tok), k1, k2, FAST_LOG)
    x = tl.where(ok, x, -float("inf"))
    top = tl.max(x, axis=0)
    # all -inf: the smallest part token, i.e. column 0 as torch's argmax
    return tl.min(tl.where((x == top) & ok, tok, _BIG), axis=0).to(tl.int64)


@triton.jit
def _combine_parts_kernel(logits_ptr, s_row, inv_t_ptr, thr_ptr, seed_ptr, pos_ptr, part_tok_ptr, out_ptr, n_parts,
                          HAS_THR: tl.constexpr, FAST_LOG: tl.constexpr, P: tl.constexpr):
    i = tl.program_id(0)
    k1, k2 = row_keys(seed_ptr, pos_ptr, i)
    thr = -float("inf")
    if HAS_THR:
        thr = tl.load(thr_ptr + i)
    tok = combine_part_tokens(logits_ptr + i.to(tl.int64) * s_row, part_tok_ptr + i * n_parts, n_parts,
                              tl.load(inv_t_ptr + i), thr, k1, k2, HAS_THR, FAST_LOG, P)
    tl.store(out_ptr + i, tok)


def gumbel_sample_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    threshold: torch.Tensor | None = None, out: torch.Tensor | None = None, block: int = 2048,
    num_warps: int = 8, num_stages: int = 1, split: int = 1,
) -> torch.Tensor:
    """[n, V] logits (any float dtype) -> [n] int64 tokens; inv_temp 0 = argmax.

    ``threshold`` ([n] float32, on logits * inv_temp) keeps only tokens at or above it.
    ``split`` > 1 spreads each row over that many programs (contiguous parts of whole
    tiles) and picks among their tokens in a second small kernel: more loads in flight
    when there are few rows per SM, at the price of one noise tile per part."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if out is None:
        out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n:
        inv = inv_temp.float().contiguous()
        thr = threshold.float().contiguous() if threshold is not None else inv
        seeds, positions = seeds.contiguous(), positions.contiguous()
        split = max(1, min(split, triton.cdiv(vocab, block)))
        part = triton.cdiv(triton.cdiv(vocab, split), block) * block
        split = triton.cdiv(vocab, part)
        dst = out if split == 1 else torch.empty((n, split), dtype=torch.int64, device=logits.device)
        flags = dict(HAS_THR=threshold is not None, FAST_LOG=use_fast_log(logits.device))
        _gumbel_argmax_kernel[(n, split)](
            logits, logits.stride(0), inv, thr, seeds, positions, dst, vocab, part,
            **flags, BLOCK=block, NS=num_stages, num_warps=num_warps,
        )
        if split > 1:
            _combine_parts_kernel[(n,)](logits, logits.stride(0), inv, thr, seeds, positions, dst, out, split,
                                        **flags, P=triton.next_power_of_2(split), num_warps=1)
    return out
