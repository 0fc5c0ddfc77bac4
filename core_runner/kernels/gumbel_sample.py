"""Gumbel-Max sampling in one pass over the logits (Triton twin of
``core_runner.sample.sampler.gumbel_sample_ref``, drawing the very numbers of
``core_runner.sample.rng``).

One program per request streams its logits row in tiles, scales it by the inverse
temperature, drops the tokens below the row's top-k/top-p/min-p threshold (if any),
adds Gumbel noise made by the stateless hash keyed by (seed, position, vocab index),
and keeps a running argmax. Rows with inverse temperature 0 (greedy) skip the noise
and the threshold: plain argmax. Nothing of size batch x vocab is allocated. The
inverse temperature comes from torch (IEEE division) so that x * (1 / T) is the same
number here and in the reference. The hash is computed in uint64 with explicit 32-bit
masks, so it equals the torch version (which builds the products from 16-bit halves).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# The constants are those of core_runner.sample.rng (GOLDEN, M1, M2); the kernel test
# compares the two draws bit for bit.

@triton.jit
def _fmix32(x):
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & 0xFFFFFFFF
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & 0xFFFFFFFF
    return x ^ (x >> 16)


@triton.jit
def _gumbel_argmax_kernel(
    logits_ptr, s_row, inv_t_ptr, thr_ptr, seed_ptr, pos_ptr, out_ptr, vocab,
    HAS_THR: tl.constexpr, BLOCK: tl.constexpr,
):
    i = tl.program_id(0)
    inv_t = tl.load(inv_t_ptr + i)
    thr = -float("inf")
    if HAS_THR:
        thr = tl.load(thr_ptr + i)
    seed = tl.load(seed_ptr + i).to(tl.uint64)
    pos = tl.load(pos_ptr + i).to(tl.uint64) & 0xFFFFFFFF
    lo = seed & 0xFFFFFFFF
    hi = (seed >> 32) & 0xFFFFFFFF
    k1 = _fmix32(lo ^ _fmix32(hi ^ (((pos + 1) * 0x9E3779B1) & 0xFFFFFFFF)))
    k2 = _fmix32(k1 ^ 0xC2B2AE35)
    best = -float("inf")
    best_idx = 0
    row = logits_ptr + i.to(tl.int64) * s_row
    for start in range(0, vocab, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < vocab
        x = tl.load(row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        if inv_t > 0:
            x = x * inv_t
            x = tl.where(x >= thr, x, -float("inf"))
            c = cols.to(tl.uint64)
            h = _fmix32((((c + 1) * 0x9E3779B1) & 0xFFFFFFFF) ^ k1)
            h = _fmix32(h ^ k2)
            u = ((h >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)
            x = x - tl.log(-tl.log(u))
        x = tl.where(mask, x, -float("inf"))
        m = tl.max(x, axis=0)
        idx = tl.argmax(x, axis=0) + start
        take = m > best
        best_idx = tl.where(take, idx, best_idx)
        best = tl.where(take, m, best)
    tl.store(out_ptr + i, best_idx.to(tl.int64))


def gumbel_sample_triton(
    logits: torch.Tensor, inv_temp: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    threshold: torch.Tensor | None = None, out: torch.Tensor | None = None, block: int = 2048,
) -> torch.Tensor:
    """[n, V] logits (any float dtype) -> [n] int64 tokens; inv_temp 0 = argmax.

    ``threshold`` ([n] float32, on logits * inv_temp) keeps only tokens at or above it."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    if out is None:
        out = torch.empty(n, dtype=torch.int64, device=logits.device)
    if n:
        _gumbel_argmax_kernel[(n,)](
            logits, logits.stride(0), inv_temp.float().contiguous(),
            threshold if threshold is not None else inv_temp, seeds, positions, out, vocab,
            HAS_THR=threshold is not None, BLOCK=block,
        )
    return out
