"""Gumbel-Max sampling in one pass over the logits (Triton twin of ``gumbel.gumbel_sample_ref``,
drawing the very numbers of ``rng``).

A program streams its columns in tiles of BLOCK, scales them by the inverse temperature,
optionally drops tokens below a threshold, adds the noise of the stateless hash keyed by
(seed, position, column) and keeps a running maximum per lane (column mod BLOCK). A strict
'>' keeps each lane's first column, and the final reduction takes the smallest column among
the lanes holding the maximum: ties resolve as torch's argmax. Greedy rows (inverse
temperature 0) take the plain argmax of the raw logits.

The hash is native uint32 arithmetic (wrapping multiply, as rng.py's 16-bit-half products;
tests compare them bit for bit). The noise is -log(-log(u)); the inner log must be accurate
relative to 1 - u, so it is ``tl.log``; the outer one only needs absolute accuracy, so on an
NVIDIA GPU it is ``libdevice.fast_logf``.

Skip test: the two logs cost most of a token's instructions, yet few tokens can win. Once a
row has a best noisy value B, a token can only win if x + g >= B, and its noise is bounded by
its hash alone: with W = 2**24 - 1 - (top 24 bits of h), 1 - u >= W / 2**24 and -log(u) >= 1 - u,
so g <= log(2**24 / W). The token is skipped when W > 2**24 exp(x - B + eps) (eps covers the
float error of the noise and of x + g), a tile whose max is G_MAX below B is skipped before
hashing. Skipped tokens lie strictly below B, so the result (and its tie rule) is unchanged.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

_GOLDEN = tl.constexpr(0x9E3779B1)  # rng.GOLDEN
_U_MAX = tl.constexpr(1.0 - 2.0**-24)  # rng.U_MAX
_BIG = tl.constexpr(2**31 - 1)
_G_MAX = tl.constexpr(16.7)  # the largest noise -log(-log(U_MAX)) = 16.6355, plus float error


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
    return _fmix32(hc ^ k1) ^ k2


@triton.jit
def _uniform_of_hash(h):
    return tl.minimum(((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0), _U_MAX)


@triton.jit
def hash_uniform(hc, k1, k2):
    """float32 uniforms in (0, 1) of the columns whose ``col_hash`` is hc (rng.uniform)."""
    return _uniform_of_hash(token_hash(hc, k1, k2))


@triton.jit
def _noise_of_hash(h, FAST_LOG: tl.constexpr):
    e = -tl.log(_uniform_of_hash(h))
    if FAST_LOG:
        g = -libdevice.fast_logf(e)
    else:
        g = -tl.log(e)
    return g


@triton.jit
def gumbel_noise(hc, k1, k2, FAST_LOG: tl.constexpr):
    """Gumbel noise of the columns whose ``col_hash`` is hc (rng.gumbel)."""
    return _noise_of_hash(token_hash(hc, k1, k2), FAST_LOG)


@triton.jit
def first_argmax(best, idx):
    """Smallest index among the lanes holding the maximum of ``best``."""
    top = tl.max(best, axis=0)
    return tl.min(tl.where(best == top, idx, _BIG), axis=0)


@triton.jit
def _could_reach(x, h, best_row):
    """False only where x + noise(h) < best_row for sure (see the module docstring)."""
    # 2**23 + floor(W / 2) as a float: no int -> float conversion
    wf = (((h ^ 0xFFFFFFFF) >> 9) | 0x4B000000).to(tl.float32, bitcast=True)
    margin = 1e-3 + 4e-6 * tl.abs(best_row)
    r = 8388608.0 + 8388608.0 * tl.math.exp2((x - best_row + margin) * 1.4426950408889634)
    return ~(wf > r)  # a NaN bound (inf - inf) counts as "could"


@triton.jit
def gumbel_pass(row, hi, inv_t, thr, k1, k2, HAS_THR: tl.constexpr, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr,
                lo):
    """argmax over columns [lo, hi) of x + noise, x = logit * inv_t (only x >= thr with HAS_THR)."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -float("inf"), tl.float32)
    bidx = lo + lanes
    best_row = tl.full([], -float("inf"), tl.float32)
    hc = col_hash(lo + lanes)
    nxt = tl.load(row + lo + lanes, mask=lo + lanes < hi, other=-float("inf"))
    for start in range(lo, hi, BLOCK):
        cols = start + lanes
        x = nxt.to(tl.float32) * inv_t
        # the next tile's load is in flight while this one is hashed
        nxt = tl.load(row + BLOCK + cols, mask=cols + BLOCK < hi, other=-float("inf"))
        if HAS_THR:
            x = tl.where(x >= thr, x, -float("inf"))
        if tl.max(x, axis=0) + _G_MAX >= best_row:
            h = token_hash(hc, k1, k2)
            if tl.max(_could_reach(x, h, best_row).to(tl.int32), axis=0) > 0:
                v = x + _noise_of_hash(h, FAST_LOG)
                take = v > best
                best = tl.where(take, v, best)
                bidx = tl.where(take, cols, bidx)
                best_row = tl.max(best, axis=0)
        hc += (BLOCK * 0x9E3779B1) & 0xFFFFFFFF
    return first_argmax(best, bidx)


@triton.jit
def argmax_pass(row, hi, BLOCK: tl.constexpr, lo):
    """Plain argmax of the raw logits in columns [lo, hi) (first index of the maximum)."""
    lanes = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], -float("inf"), tl.float32)
    bidx = lo + lanes
    for start in range(lo, hi, BLOCK):
        cols = start + lanes
        x = tl.load(row + cols, mask=cols < hi, other=-float("inf")).to(tl.float32)
        take = x > best
        best = tl.where(take, x, best)
        bidx = tl.where(take, cols, bidx)
    return first_argmax(best, bidx)


@triton.jit
def combine_part_tokens(row, part_tok_ptr, n_parts, inv_t, thr, k1, k2, HAS_THR: tl.constexpr,
                        FAST_LOG: tl.constexpr, P: tl.constexpr):
    """The row's token from its parts' tokens: each one's noisy value (raw logit when greedy)
    is computed again by the same expressions, the largest wins, ties go to the smallest
    column (the parts are disjoint and each holds its first maximum)."""
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
def _part_kernel(logits_ptr, s_row, inv_t_ptr, thr_ptr, seed_ptr, pos_ptr, out_ptr, vocab, part,
                 HAS_THR: tl.constexpr, FAST_LOG: tl.constexpr, BLOCK: tl.constexpr):
    """Program (i, s) draws row i over its columns [s * part, (s + 1) * part)."""
    i = tl.program_id(0)
    s = tl.program_id(1)
    row = logits_ptr + i.to(tl.int64) * s_row
    lo = s * part
    hi = tl.minimum(lo + part, vocab)
    inv_t = tl.load(inv_t_ptr + i)
    if inv_t > 0:
        thr = -float("inf")
        if HAS_THR:
            thr = tl.load(thr_ptr + i)
        k1, k2 = row_keys(seed_ptr, pos_ptr, i)
        tok = gumbel_pass(row, hi, inv_t, thr, k1, k2, HAS_THR, FAST_LOG, BLOCK, lo)
    else:
        tok = argmax_pass(row, hi, BLOCK, lo)
    tl.store(out_ptr + i * tl.num_programs(1) + s, tok.to(tl.int64))


@triton.jit
def _combine_kernel(logits_ptr, s_row, inv_t_ptr, thr_ptr, seed_ptr, pos_ptr, part_tok_ptr, out_ptr, n_parts,
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
    threshold: torch.Tensor | None = None, block: int = 256, num_warps: int = 1, split: int = 16,
) -> torch.Tensor:
    """[n, V] logits (any float dtype) -> [n] int64 tokens; inv_temp 0 = argmax.

    ``threshold`` ([n] float32, on logits * inv_temp) keeps only tokens at or above it.
    Each row is spread over ``split`` programs (contiguous parts of whole tiles), whose
    tokens a second small kernel combines: many loads in flight even with few rows."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n == 0:
        return out
    inv = inv_temp.float().contiguous()
    thr = threshold.float().contiguous() if threshold is not None else inv
    seeds, positions = seeds.contiguous(), positions.contiguous()
    split = max(1, min(split, triton.cdiv(vocab, block)))
    part = triton.cdiv(triton.cdiv(vocab, split), block) * block
    split = triton.cdiv(vocab, part)
    dst = out if split == 1 else torch.empty((n, split), dtype=torch.int64, device=logits.device)
    flags = dict(HAS_THR=threshold is not None, FAST_LOG=use_fast_log(logits.device))
    _part_kernel[(n, split)](logits, logits.stride(0), inv, thr, seeds, positions, dst, vocab, part,
                             **flags, BLOCK=block, num_warps=num_warps)
    if split > 1:
        _combine_kernel[(n,)](logits, logits.stride(0), inv, thr, seeds, positions, dst, out, split,
                              **flags, P=triton.next_power_of_2(split), num_warps=1)
    return out
